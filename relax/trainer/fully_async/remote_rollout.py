"""The training side of ``--fully-async``: a collector whose batches come from a rollout rank
(relax/trainer/fully_async/rollout_worker.py), and the weight publication after each step.

    remote = RemoteRollout(...)          the Trainer's collector
    remote.start(step)                   once built (and resumed): the rollout ranks begin
    batch = remote.collect(step)         this training rank's share of step's batch, sampled
                                         with the weights after step Schedule.version(step)
    remote.publish(step + 1)             the weights after step + 1, when a batch needs them
    remote.state_dict()                  the batches in flight and the rollout side's position

:meth:`RemoteRollout.start` starts the rollout ranks: each training rank sends its rollout rank the
first step to sample, the schedule (relax/trainer/fully_async/async_layout.py; on ``--load`` continued from
the checkpoint's step, with the stored batches its lag allows), the collector state and the
shapes of the weights it will send, and waits for the answer: a rollout rank that would follow
another schedule or build another model says so, and both sides end with that line instead
of waiting on each other.

Metrics (reinforce_plus_plus.md §10; per rollout step, reduced over the training ranks):
``async/staleness`` (steps between the weights a batch was sampled with and the weights it
trains; with ``--rollout-backend vllm`` the oldest weights the servers reported for its
samples, :func:`served_version`), ``async/train_idle_fraction`` (share of the step cycle this training rank waited for
its batch), ``async/rollout_idle_fraction`` (share of the rollout ranks' time spent waiting
for weights), ``async/weight_sync_time`` and ``async/weight_sync_bytes``,
``async/train_samples_per_s`` and ``async/rollout_samples_per_s``, and the rollout ranks'
``async/rollout_generate_time`` and ``async/rollout_reward_time``; the rollout ranks' own
``rollout/*`` records (rewards, reward errors) arrive with the batch.
"""

from __future__ import annotations

import contextlib
import sys
import time

from relax.errors import InputError, RelaxError
from relax.rollout.generation.batch import StepBatch
from relax.trainer.fully_async import weight_sync
from relax.trainer.fully_async.async_layout import (
    AsyncLayout,
    Schedule,
    naming_the_peer,
    recv_object,
    send_and_wait,
)


class RemoteRollout:
    """``batches``: ``cfg.batches``; ``ctx``: this training rank's data-parallel context;
    ``policy``: relax/trainer/policy/bundle.py; ``source``: the prompt stream (for the data position
    a checkpoint records); ``bucket_bytes``: --weight-sync-bucket-mb; ``fsdp``: the policy is
    sharded (the weights are gathered before they are sent)."""

    def __init__(self, batches, ctx, layout: AsyncLayout, schedule: Schedule, *, policy, source,
                 tracker, timeout_minutes: float, bucket_bytes: int, fsdp: bool):
        self.ctx, self.layout, self.schedule, self.policy = ctx, layout, schedule, policy
        self.source, self.tracker = source, tracker
        # this rank's rows of a step's batch (whole groups of its share of the prompts)
        self.rows = batches.rollout_batch_size // layout.trainers * batches.n_samples_per_prompt
        self.bucket_bytes = bucket_bytes
        self.fsdp, self.timeout_minutes = fsdp, timeout_minutes
        self.peer = layout.rollout_rank_of(ctx.rank)
        self.pending: dict[int, dict] = {}  # step -> message, received, not trained yet
        self.state: dict = {"cursor": 0}  # the rollout side's collector after the newest batch
        self.cursor = 0  # prompts consumed by the steps trained so far
        self.received = -1  # the newest step received
        self.next_step = 0  # the step the next collect trains
        self.needed: set[int] = set()
        self.started = self.stopped = False
        self.cycle = time.perf_counter()

    # ------------------------------------------------------------------ the loop's calls
    def start(self, step: int) -> None:
        """Continue the schedule from ``step`` (a checkpoint's batches in flight first, those
        its lag allows: Schedule.resumed), start the rollout rank after them, and publish the
        starting weights if a batch needs them. Called once the trainer is built, before its
        first step or its stop: the rollout ranks wait for their start before anything else
        (also a run that ends without a step: a resume with none left, a signal first)."""
        # a batch of another size (another --rollout-batch-size or --n-samples-per-prompt)
        # is not this run's: sampled again
        stored = {s: int(m["version"]) for s, m in self.pending.items()
                  if s >= step and _rows(m) == self.rows}
        self.schedule, kept = self.schedule.resumed(step, stored)
        self._drop_stored(step + kept)
        first = step + kept
        self.received = first - 1
        self.needed = set(self.schedule.needed(first))
        self.started, self.next_step = True, step
        self._guard("starting", lambda: self._handshake(first))
        self.cycle = time.perf_counter()
        self.publish(step)

    def collect(self, step: int):
        waited = time.perf_counter()
        message = self.pending.pop(step, None) or self._receive(step)
        now = time.perf_counter()
        waited, cycle, self.cycle = now - waited, now - self.cycle, now
        self.next_step, self.cursor = step + 1, int(message["state"]["cursor"])
        self._record(step, message, waited, cycle)
        return message["batch"].to(self.ctx.device)

    def publish(self, version: int) -> None:
        """After ``version`` optimizer rollout steps: send the weights if a batch to come is
        sampled with them (every training rank calls it; training rank 0 sends)."""
        seconds, sent = 0.0, 0
        if version in self.needed:
            start = time.perf_counter()
            self._guard("sending weights", lambda: self._publish(version))
            seconds, sent = time.perf_counter() - start, self._sent
        self.tracker.add_max("async/weight_sync_time", seconds)
        self.tracker.add_max("async/weight_sync_bytes", sent)

    def _publish(self, version: int) -> None:
        sender = self.ctx.rank == 0
        if sender:
            weight_sync.send_header(weight_sync.WEIGHTS, version, self.layout.sync_group,
                                    self.ctx.device, self.timeout_minutes)
        self._sent = weight_sync.publish(self.policy.module, sender=sender,
                                         group=self.layout.sync_group, device=self.ctx.device,
                                         bucket_bytes=self.bucket_bytes,
                                         gather=self.fsdp and self.ctx.world_size > 1,
                                         timeout_minutes=self.timeout_minutes)

    def close(self) -> None:
        """End the rollout ranks' loop (training rank 0 sends the stop header); a rollout rank
        that is gone already is not waited for."""
        if self.started and not self.stopped and self.ctx.rank == 0:
            with contextlib.suppress(Exception):
                weight_sync.send_header(weight_sync.STOP, -1, self.layout.sync_group,
                                        self.ctx.device, self.timeout_minutes)
        self.stopped = True

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The batches in flight at a checkpoint after ``next_step`` steps (received here
        first: they were sampled with weights the checkpoint does not hold) and the rollout
        side's collector after the last of them; ``cursor``: where a colocated resume starts."""
        if self.started:
            for step in self.schedule.in_flight(self.next_step):
                if step not in self.pending and step > self.received:
                    self.pending[step] = self._receive(step)
        pending = {s: {**m, "batch": m["batch"].plain()} for s, m in self.pending.items()}
        return {"pending": pending, "rollout": self.state, "cursor": self.cursor}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's :meth:`state_dict`, or a colocated run's ``{"cursor"}``."""
        self.pending = {s: {**m, "batch": StepBatch.from_plain(m["batch"])}
                        for s, m in (state.get("pending") or {}).items()}
        self.cursor = int(state["cursor"])
        self.state = dict(state.get("rollout") or {"cursor": self.cursor})

    def position(self) -> dict[str, int]:
        return {**self.source.position_at(self.cursor), "cursor": self.cursor}

    # ------------------------------------------------------------------ internals
    def _handshake(self, first: int) -> None:
        """Send the start (first step, schedule, collector state, the weights' shapes); the
        rollout rank answers None, or the line saying why it cannot follow (InputError on
        both sides)."""
        send_and_wait({"first": first, "schedule": self.schedule.to_dict(), "state": self.state,
                       "weights": weight_sync.signature(self.policy.module)},
                      self.peer, self.timeout_minutes)
        problem = recv_object(self.peer, self.timeout_minutes)
        if problem is not None:
            raise InputError(problem)

    def _drop_stored(self, first: int) -> None:
        """Forget the stored batches from ``first`` on (not this run's size, a lag this run's
        schedule does not allow, or past its end): the rollout rank samples them again with
        the checkpoint's weights, from the collector state before the first of them."""
        dropped = sorted(s for s in self.pending if s >= first)
        if not dropped:
            return
        kept = [s for s in self.pending if s < first]
        self.state = dict(self.pending[max(kept)]["state"]) if kept else {"cursor": self.cursor}
        messages = [self.pending.pop(s) for s in dropped]
        if self.ctx.is_main and dropped[0] < self.schedule.total_steps:
            print(f"relax train: --load: the checkpoint's batches of steps "
                  f"{', '.join(str(s + 1) for s in dropped)} are sampled again with its weights: "
                  f"{self._why_not(dropped[0], messages[0])}", file=sys.stderr, flush=True)

    def _why_not(self, step: int, message: dict) -> str:
        """Why a stored batch does not train as it is (the first of those dropped)."""
        rows, lag = _rows(message), step - int(message["version"])
        if rows != self.rows:
            return (f"step {step + 1}'s has {rows} rows per training rank, this run's have "
                    f"{self.rows} (another --rollout-batch-size or --n-samples-per-prompt)")
        s = self.schedule
        if lag > s.max_lag:
            return (f"step {step + 1}'s was sampled {lag} steps behind, more than "
                    f"--max-staleness {s.staleness} --update-weights-interval {s.interval} "
                    f"allow ({s.max_lag})")
        return f"they follow step {step}'s, which is sampled again"

    def _receive(self, step: int) -> dict:
        message = self._guard(f"waiting for step {step + 1}'s batch",
                              lambda: recv_object(self.peer, self.timeout_minutes))
        if message["step"] != step:
            raise RuntimeError(f"rollout rank {self.peer} sent step {message['step'] + 1}'s "
                               f"batch where step {step + 1}'s was due")
        self.received, self.state = step, message["state"]
        return message

    def _guard(self, doing: str, call):
        """Name the side that failed: a rollout rank gone, or a peer of the weight sync."""
        return naming_the_peer(f"{doing}: rollout rank {self.peer} (--rollout-num-gpus) or "
                               "training rank 0", self.timeout_minutes, call)

    def _record(self, step: int, message: dict, waited: float, cycle: float) -> None:
        t, rows = self.tracker, len(message["batch"].prompts)
        t.merge(message["records"])
        for name, seconds in message["times"].items():
            t.add_max(f"async/rollout_{name}_time", seconds)
        t.add_max("async/staleness", step - served_version(step, message, self.schedule))
        t.add_max("async/train_idle_fraction", waited / max(cycle, 1e-9))
        t.add_ratio("async/rollout_idle_fraction", message["idle"], message["cycle"])
        t.add_sum("async/train_samples_per_s", rows / max(cycle, 1e-9))
        t.add_sum("async/rollout_samples_per_s", rows / max(message["cycle"], 1e-9))


def served_version(step: int, message: dict, schedule: Schedule) -> int:
    """The weights version batch ``step`` (a rollout rank's ``message``) was sampled with: the
    oldest its vLLM servers reported for its samples (``served``: version and URL), else the
    version the rollout rank held (Relax's engine samples the weights it holds; a batch
    stored by an older checkpoint). A served version further behind than the fixed lag
    allows is refused in one line: the rollout rank pushed the schedule's weights, so a
    server sampled with older ones while reporting them as current."""
    served = message.get("served")
    if served is None:
        return int(message["version"])
    version, url = int(served[0]), served[1]
    if step - version > schedule.max_lag:
        raise RelaxError(f"step {step + 1}'s batch holds samples that vLLM server {url} drew "
                         f"with weights version {version}, {step - version} steps behind, "
                         f"more than --max-staleness {schedule.staleness} "
                         f"--update-weights-interval {schedule.interval} allow "
                         f"({schedule.max_lag}): that server kept older weights than the "
                         f"version {message['version']} pushed to it")
    return version


def _rows(message: dict) -> int:
    """The rows per training rank of the run that sampled a stored batch (dynamic sampling may
    have kept fewer; a checkpoint of an earlier version does not say)."""
    return int(message.get("rows", len(message["batch"].prompts)))
