"""``--fully-async``: who does what in the torchrun job, which weights each batch is sampled
with, and how batches travel.

    ranks 0 .. A-1        training ranks (DDP or FSDP2 among themselves, as in the colocated
                          loop; A = --actor-num-nodes x --actor-num-gpus-per-node)
    ranks A .. A+R-1      rollout ranks (R = --rollout-num-gpus): sample and score only

The rollout side produces exactly the batches the colocated loop with A data-parallel ranks
would: training rank v's share of step n comes from a collector that acts as data-parallel
rank v of A (its prompts, its random stream ``seed_for(seed, "rollout", v, n)``), run by
rollout rank ``A + v mod R``. So the numbers do not depend on R, and with
``--max-staleness 0`` they are the colocated loop's (tested).

**The fixed lag** (:class:`Schedule`). Step n trains on the batch sampled with the weights
after step ``version(n) = I * floor(max(0, n - K) / I)`` (K = --max-staleness,
I = --update-weights-interval); the training side publishes exactly the versions some
remaining batch needs, in order. Nothing depends on timing, so a seeded run repeats exactly
and a checkpoint after step s holds the batches already in flight (those sampled with weights
older than s), which ``--load`` trains on before anything new is sampled.

Process groups (created by every rank in the same order, as ``new_group`` requires): the
training ranks' group (the data-parallel group of everything that trains), and the sync
group of training rank 0 with every rollout rank (weight broadcasts and control headers).
Batches go point to point from a rollout rank to its training rank over the world group.
"""

from __future__ import annotations

import datetime
import io
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from relax.errors import PeerFailure
from relax.trainer.distributed import DistContext, is_peer_failure

TRAIN, ROLLOUT = "training", "rollout"


@dataclass(frozen=True)
class Schedule:
    """Which weights each step's batch is sampled with (the module docstring's fixed lag)."""

    staleness: int  # K
    interval: int  # I
    total_steps: int

    def version(self, step: int) -> int:
        """The weights (optimizer rollout steps completed) batch ``step`` is sampled with."""
        return self.interval * (max(0, step - self.staleness) // self.interval)

    def needed(self, first: int) -> list[int]:
        """The versions the batches ``first .. total_steps - 1`` are sampled with, ascending."""
        return sorted({self.version(n) for n in range(first, self.total_steps)})

    def in_flight(self, completed: int) -> range:
        """Batches a checkpoint after ``completed`` steps holds: not trained yet and sampled
        with weights older than the checkpoint's (the checkpoint cannot recreate those)."""
        end = completed
        while end < self.total_steps and self.version(end) < completed:
            end += 1
        return range(completed, end)


@dataclass(frozen=True)
class AsyncLayout:
    """This process's role and the job's groups (:func:`split_roles`)."""

    role: str  # TRAIN or ROLLOUT
    trainers: int  # A
    rollouts: int  # R
    rank: int  # in the world group
    train_group: object
    sync_group: object  # training rank 0 and the rollout ranks

    @property
    def is_rollout(self) -> bool:
        return self.role == ROLLOUT

    def rollout_rank_of(self, trainer: int) -> int:
        """The rollout rank (world rank) that samples training rank ``trainer``'s share."""
        return self.trainers + trainer % self.rollouts

    def shares(self) -> list[int]:
        """A rollout rank's training ranks (the data-parallel ranks whose shares it samples)."""
        return [v for v in range(self.trainers) if self.rollout_rank_of(v) == self.rank]

    def finish_together(self) -> None:
        """Every rank of the job, both roles, waits here before leaving the process group."""
        dist.barrier()


def split_roles(ctx: DistContext, trainers: int) -> tuple[AsyncLayout, DistContext]:
    """The layout and the context this rank works in: a training rank's ``DistContext`` is the
    data-parallel one (rank and world among the training ranks, their group)."""
    world = ctx.world_size
    if world < 2 or not 1 <= trainers < world:
        raise ValueError(f"--fully-async needs training and rollout ranks; got {trainers} of "
                         f"{world}")
    train_group = dist.new_group(ranks=list(range(trainers)))
    sync_group = dist.new_group(ranks=[0, *range(trainers, world)])
    role = TRAIN if ctx.rank < trainers else ROLLOUT
    layout = AsyncLayout(role=role, trainers=trainers, rollouts=world - trainers, rank=ctx.rank,
                         train_group=train_group, sync_group=sync_group)
    if role == TRAIN:
        return layout, replace(ctx, world_size=trainers, group=train_group)
    return layout, replace(ctx, rank=ctx.rank - trainers, world_size=world - trainers,
                           group=None)


def naming_the_peer(what: str, timeout_minutes: float, call):
    """``call()``; a failure of the other side (a closed connection, a timeout) becomes one
    PeerFailure line: ``what`` says who waited for whom."""
    try:
        return call()
    except Exception as e:
        if not is_peer_failure(e):
            raise
        raise PeerFailure(f"{what} died or did not answer within --distributed-timeout-minutes "
                          f"{timeout_minutes:g}: {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:200]}") from e


# ---------------------------------------------------------------------- transport
def send_object(obj, dst: int) -> list:
    """Start sending ``obj`` (tensors, lists, dataclasses) to world rank ``dst``; returns the
    pending works, which keep their buffers alive until waited on."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    size = torch.tensor([payload.numel()], dtype=torch.int64)
    return [(dist.isend(size, dst), size), (dist.isend(payload, dst), payload)]


def recv_object(src: int, timeout_minutes: float):
    """What :func:`send_object` sent from world rank ``src``. Waits at most
    ``timeout_minutes`` (--distributed-timeout-minutes) for each part: a point-to-point
    receive does not take the group's timeout by itself (measured with Gloo: it waits
    forever), so a hung sender raises "Timed out" like a collective would."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    size = torch.empty(1, dtype=torch.int64)
    dist.irecv(size, src).wait(timeout=timeout)
    payload = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.irecv(payload, src).wait(timeout=timeout)
    # our own peer's bytes, over the job's private group: full unpickling is intended
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=False)
