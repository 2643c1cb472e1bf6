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
older than s), which ``--load`` trains on before anything new is sampled. With ``--save`` the
rollout ranks also sample the batches in flight after the last step, so the final checkpoint
holds them too and a run continued from it (a higher --num-rollout) is the uninterrupted run.

**Resuming with other K or I** (:meth:`Schedule.resumed`): weights older than the checkpoint's
no longer exist, so the resumed run's versions are the new schedule's, never older than the
checkpoint step s: ``max(s, I' * floor(max(0, n - K') / I'))``, as a fresh run's are never
older than its initial weights. A stored batch trains as it is when its lag is one the new
schedule allows (at most ``K' + I' - 1``) and it has this run's size, else it and the stored
ones after it are sampled again with the checkpoint's weights. The training side decides
this and sends the schedule in its start message, so the two roles cannot follow different
ones; every rank first compares the settings both roles share (:func:`check_same_settings`)
and a difference ends every rank in one line before any other wait.

Process groups (created by every rank in the same order, as ``new_group`` requires): the
training ranks' group (the data-parallel group of everything that trains), the sync
group of training rank 0 with every rollout rank (weight broadcasts and control headers),
with ``--async-save`` a Gloo group of the training ranks for the checkpoint writes of the
background thread (relax/trainer/state/checkpoint.py: its collectives must not interleave with
training's; the rollout ranks hold no checkpoint state), and the rollout ranks' own group,
over which the collectors' agreements (dynamic sampling's rounds, partial rollouts' prompt
counts, failing together) are reduced after the shares of each process
(relax/agreement.py).
Batches go point to point from a rollout rank to its training rank over the world group.
"""

from __future__ import annotations

import datetime
import io
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist

from relax.config.section import value_of
from relax.errors import InputError, PeerFailure
from relax.trainer.distributed import DistContext, is_peer_failure

TRAIN, ROLLOUT = "training", "rollout"


@dataclass(frozen=True)
class Schedule:
    """Which weights each step's batch is sampled with (the module docstring's fixed lag)."""

    staleness: int  # K
    interval: int  # I
    total_steps: int  # steps this run trains
    floor: int = 0  # the oldest weights there are: a resumed run's checkpoint step
    carry: bool = False  # also sample the batches in flight after the last step (--save)

    def version(self, step: int) -> int:
        """The weights (optimizer rollout steps completed) batch ``step`` is sampled with."""
        return max(self.floor, self.interval * (max(0, step - self.staleness) // self.interval))

    @property
    def max_lag(self) -> int:
        """The largest ``step - version(step)`` the lag itself produces."""
        return self.staleness + self.interval - 1

    @property
    def end(self) -> int:
        """One past the last batch sampled: ``total_steps``, and with ``carry`` the batches a
        checkpoint after the last step holds (sampled with weights older than its own)."""
        end = self.total_steps
        while self.carry and self.version(end) < self.total_steps:
            end += 1
        return end

    def needed(self, first: int) -> list[int]:
        """The versions the batches ``first .. end - 1`` are sampled with, ascending."""
        return sorted({self.version(n) for n in range(first, self.end)})

    def in_flight(self, completed: int) -> range:
        """Batches a checkpoint after ``completed`` steps holds: not trained yet and sampled
        with weights older than the checkpoint's (the checkpoint cannot recreate those)."""
        end = completed
        while end < self.end and self.version(end) < completed:
            end += 1
        return range(completed, end)

    def resumed(self, step: int, stored: dict[int, int]) -> tuple[Schedule, int]:
        """This schedule continuing a checkpoint of ``step`` whose stored batches were sampled
        with ``stored`` {step: version}: (the schedule, how many stored batches train as they
        are: the consecutive ones from ``step`` whose lag it allows and that it samples)."""
        schedule = replace(self, floor=step)
        kept = 0
        while (step + kept) in stored and step + kept < schedule.end and \
                step + kept - stored[step + kept] <= schedule.max_lag:
            kept += 1
        return schedule, kept

    def to_dict(self) -> dict:
        return asdict(self)


# What the two roles must agree on (the layout, the schedule, the weights and the batches that
# travel): compared across all ranks before anything else waits (check_same_settings)
SHARED = ("fully_async", "world_size", "rollout_num_gpus", "max_staleness",
          "update_weights_interval", "weight_sync_bucket_mb", "num_rollout", "num_epoch",
          "seed", "rollout_batch_size", "n_samples_per_prompt", "lora_rank", "fsdp",
          "async_save",
          # what the rollout side's collectors are (relax/rollout/assembly.py)
          "dynamic_sampling_filter_path", "over_sampling_batch_size",
          "dynamic_sampling_max_rounds", "partial_rollout", "env", "use_agentic_rollout",
          "rollout_backend")


def check_same_settings(cfg) -> None:
    """Every rank's :data:`SHARED` settings are the same (one all-gather over the job), else
    :class:`InputError` on every rank naming the first that differs: nodes launched with
    other flags would otherwise wait on each other until --distributed-timeout-minutes."""
    mine = {k: value_of(cfg, k) for k in SHARED}
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    for key in SHARED:
        values = [s[key] for s in every]
        if len(set(map(repr, values))) > 1:
            seen: dict = {}
            for rank, value in enumerate(values):
                seen.setdefault(repr(value), []).append(str(rank))
            flag = "--" + key.replace("_", "-")
            if key == "world_size":
                flag = "the training ranks (--actor-num-nodes x --actor-num-gpus-per-node)"
            told = "; ".join(f"{v} on rank{'s' if len(r) > 1 else ''} {','.join(r)}"
                             for v, r in seen.items())
            raise InputError(f"the ranks of this job were launched with different {flag}: "
                             f"{told}; launch every node with the same flags")


@dataclass(frozen=True)
class AsyncLayout:
    """This process's role and the job's groups (:func:`split_roles`)."""

    role: str  # TRAIN or ROLLOUT
    trainers: int  # A
    rollouts: int  # R
    rank: int  # in the world group
    train_group: object
    sync_group: object  # training rank 0 and the rollout ranks
    save_group: object = None  # --async-save: the training ranks, Gloo (background writes)
    rollout_group: object = None  # the rollout ranks (None: there is one)

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


def split_roles(ctx: DistContext, trainers: int, *,
                async_save: bool = False) -> tuple[AsyncLayout, DistContext]:
    """The layout and the context this rank works in: a training rank's ``DistContext`` is the
    data-parallel one (rank and world among the training ranks, their group). ``async_save``:
    also the training ranks' Gloo group of ``--async-save`` (every rank creates it)."""
    world = ctx.world_size
    if world < 2 or not 1 <= trainers < world:
        raise ValueError(f"--fully-async needs training and rollout ranks; got {trainers} of "
                         f"{world}")
    train_group = dist.new_group(ranks=list(range(trainers)))
    sync_group = dist.new_group(ranks=[0, *range(trainers, world)])
    save_group = (dist.new_group(ranks=list(range(trainers)), backend="gloo")
                  if async_save else None)
    # the collectors' agreements (relax/agreement.py); every rollout rank serves a
    # share (validation refuses more rollout ranks than training ranks)
    rollout_group = dist.new_group(ranks=list(range(trainers, world))) \
        if world - trainers > 1 else None
    role = TRAIN if ctx.rank < trainers else ROLLOUT
    layout = AsyncLayout(role=role, trainers=trainers, rollouts=world - trainers, rank=ctx.rank,
                         train_group=train_group, sync_group=sync_group, save_group=save_group,
                         rollout_group=rollout_group)
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
def send_and_wait(obj, dst: int, timeout_minutes: float) -> None:
    """:func:`send_object`, waiting at most ``timeout_minutes`` for each part to go."""
    timeout = datetime.timedelta(minutes=timeout_minutes)
    for work, _ in send_object(obj, dst):
        work.wait(timeout=timeout)


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
