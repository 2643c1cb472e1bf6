"""A rollout rank of ``--fully-async`` (relax/trainer/fully_async/async_layout.py): sample and score the
shares of the training ranks it serves, with the weights the fixed lag prescribes.

    start   <- each served training rank: the first step to sample, the schedule, the
               collector state (a checkpoint's, on --load), the shapes of the weights
    answer  -> each: None, or why this rank cannot follow (another model): both sides stop
    for step n from the first to Schedule.end:
        until holding the weights after step Schedule.version(n):
            header <- training rank 0 (weights of a version, or stop); weights <- buckets
        --rollout-backend vllm: new weights -> this rank's vLLM server (paused, reloaded)
        the served training ranks' shares in lockstep: batch_v = v's collector.collect(n)
        send each batch_v to training rank v
    header <- training rank 0: stop (also at any point before: the run ended early)

The collectors are the colocated loop's, built by the same assembly (relax/rollout/assembly.py:
prompts, dynamic sampling, partial rollouts, --env environments, agent programs), each acting
as data-parallel rank v of the training ranks: the same prompts and random streams, so the
batches do not depend on how many rollout ranks there are. They sample with Relax's engine
on the rank's copy of the policy or, with ``--rollout-backend vllm``, through a vLLM server
this rank owns (or a ``--vllm-url`` one), fed every weight version the rank receives. The
shares of this rank run on one thread each and agree with each other, then with the other
rollout ranks (relax/agreement.py: dynamic sampling's rounds, partial rollouts' prompt
counts, a failure of one share is every share's). Each message carries the step, the weights version it
was sampled with (and with ``--rollout-backend vllm`` the oldest version the servers reported
for its samples, and the URL of one that served it), the rows per training rank of this configuration, the collector's state
after it (what a checkpoint holds: the prompt cursor, partial rollouts' carried groups), the
collector's metric records and phase times, and this rank's idle and cycle seconds for the
throughput metrics (relax/trainer/fully_async/remote_rollout.py).
"""

from __future__ import annotations

import functools
import os
import signal
import time

import torch

from relax import models
from relax.agreement import Lockstep
from relax.cpu_threads import cpu_threads
from relax.errors import InputError, Interrupted, PeerFailure
from relax.metrics.tracker import MetricTracker
from relax.precision import use_bf16, use_rollout_bf16
from relax.rollout.assembly import build_rollout_side
from relax.rollout.backends.open import open_backend
from relax.rollout.backends.protocol import RolloutBackend
from relax.trainer.distributed import DistContext, is_peer_failure
from relax.trainer.fully_async import weight_sync
from relax.trainer.fully_async.async_layout import (
    AsyncLayout,
    Schedule,
    naming_the_peer,
    recv_object,
    send_and_wait,
    send_object,
)
from relax.trainer.policy.lora import add_configured
from relax.trainer.runtime import Timer


def load_rollout_policy(model_dir: str, lora, device: torch.device, backend: RolloutBackend, *,
                        seed: int, bf16: bool):
    """The policy of ``model_dir`` (--hf-checkpoint) as the training ranks build it before
    training (same weights from the same ``seed``, the same adapter of ``lora``, the LoRA
    section), for generation only, with ``backend`` started on it at ``bf16``; the module
    and its tokenizer."""
    models.quiet_transformers()
    tokenizer = models.load_tokenizer(model_dir)
    module = models.load_policy(model_dir, tokenizer, device, seed=seed)
    tuner = add_configured(module, lora, seed) if lora.enabled else None
    backend.start(module, bf16=bf16, lora=tuner)
    return module, tokenizer


class RolloutWorker:
    """One rollout rank: ``ctx`` is its own (device); ``layout`` says whom it serves;
    ``backend``: its rollout backend (:func:`serve_rollouts` opens it and closes it should
    the building fail). Built in two steps, as :func:`serve_rollouts` does: the policy and
    the lockstep of the shares here, then :meth:`take_side` with the rollout side built on
    :meth:`share_contexts`."""

    def __init__(self, ctx: DistContext, layout: AsyncLayout, backend: RolloutBackend, *,
                 model_dir: str | None, lora, seed: int, bf16: bool, bucket_mb: float,
                 timeout_minutes: float, rows: int):
        """``model_dir``, ``lora``, ``seed``: the policy as the training ranks build it
        (:func:`load_rollout_policy`); ``bucket_mb``: --weight-sync-bucket-mb;
        ``timeout_minutes``: every wait on the training side; ``rows``: a batch's rows per
        training rank in this run's configuration (what a resumed run compares)."""
        self.ctx, self.layout, self.backend, self.bf16 = ctx, layout, backend, bf16
        self.module, self.tokenizer = load_rollout_policy(
            model_dir, lora, ctx.device, self.backend, seed=seed, bf16=bf16)
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.timeout = timeout_minutes  # every wait on the training side
        self.shares = layout.shares()
        # the shares agree with each other and with the other serving rollout ranks
        self.lockstep = Lockstep(len(self.shares), layout.rollout_group, ctx.device,
                                 timeout_s=self.timeout * 60)
        self.timers = {v: Timer(ctx.device) for v in self.shares}
        self.trackers = {v: MetricTracker() for v in self.shares}
        # dynamic sampling may train on fewer rows than the configuration's
        self.rows = rows
        self.collectors = {}

    def share_contexts(self) -> list:
        """(context, agreement) of each share: data-parallel rank v of the training ranks,
        alone in this process but agreeing with the other shares."""
        ctx, layout = self.ctx, self.layout
        return [(DistContext(v, layout.trainers, ctx.local_rank, ctx.device, None),
                 self.lockstep.share(i)) for i, v in enumerate(self.shares)]

    def take_side(self, side, rollout, batches, *, seed: int) -> None:
        """The colocated loop's collectors of the shares (relax/rollout/assembly.py), from
        ``side`` (built on :meth:`share_contexts`; --rm-type genrm: one judge per rollout
        rank, for every share it samples); ``rollout``, ``batches``, ``seed``: the
        configuration's sections and --seed."""
        side.check_lengths(self.tokenizer, rollout.data, rollout.sampling.rollout_max_response_len)
        self.collectors = dict(zip(self.shares, side.collectors(
            rollout, batches, self.backend, seed=seed, tokenizer=self.tokenizer,
            eos_token_ids=models.eos_token_ids(self.tokenizer, self.module),
            context=getattr(self.module.config, "max_position_embeddings", None),
            timers=[self.timers[v] for v in self.shares],
            trackers=[self.trackers[v] for v in self.shares]), strict=True))
        self.version, self.works = -1, []

    def serve(self) -> None:
        """The loop of the module docstring; returns when training rank 0 says stop."""
        first, schedule = self._start()
        clock = time.perf_counter()
        for step in range(first, schedule.end):
            idle = self._weights_for(schedule.version(step))
            if idle is None:
                return
            batches = self.lockstep.run([functools.partial(self.collectors[v].collect, step)
                                         for v in self.shares])
            self._record_backend()
            served = self.backend.served()  # what the vLLM servers report, checked by the trainer
            now = time.perf_counter()
            for v, batch in zip(self.shares, batches, strict=True):
                message = {"step": step, "version": self.version, "served": served,
                           "batch": batch.to("cpu"),
                           "rows": self.rows, "state": self.collectors[v].state_dict(),
                           "records": self.trackers[v].export(), "times": self.timers[v].pop(),
                           "idle": idle, "cycle": now - clock}
                self.works = [w for w in self.works if not w[0].is_completed()]
                self.works += send_object(message, v)
            clock = time.perf_counter()
        self._weights_for(None)  # the stop header after the last batch

    def close(self) -> None:
        """The collectors' own processes (agent endpoints) and an owned vLLM server end with
        the rank."""
        try:
            for collector in self.collectors.values():
                collector.close()
        finally:
            try:
                self.lockstep.close()
            finally:
                self.backend.close()

    def _start(self) -> tuple[int, Schedule]:
        """Each served training rank's start, answered (None, or why not: then InputError
        here too); the first step and the schedule the training ranks chose."""
        starts = {v: self._guard(v, "waiting for its start",
                                 lambda v=v: recv_object(v, self.timeout))
                  for v in self.shares}
        lead = starts[self.shares[0]]
        problem = self._problem(lead, starts)
        for v in self.shares:
            self._guard(v, "answering its start",
                        lambda v=v: send_and_wait(problem, v, self.timeout))
        if problem is not None:
            raise InputError(problem)
        for v, start in starts.items():
            self.collectors[v].load_state_dict(start["state"])
        return int(lead["first"]), Schedule(**lead["schedule"])

    def _problem(self, lead: dict, starts: dict) -> str | None:
        """Why this rank cannot follow the training ranks' start, or None."""
        for v, start in starts.items():
            if (start["first"], start["schedule"]) != (lead["first"], lead["schedule"]):
                return (f"training ranks {self.shares[0]} and {v} sent rollout rank "
                        f"{self.layout.rank} different starts ({lead['first']}, "
                        f"{lead['schedule']} vs {start['first']}, {start['schedule']})")
        differ = weight_sync.signature_difference(weight_sync.signature(self.module),
                                                  lead["weights"])
        if differ:
            return (f"rollout rank {self.layout.rank} builds another model than the training "
                    f"ranks ({differ}); give every node the same --hf-checkpoint and LoRA "
                    "flags")
        return None

    def _weights_for(self, version: int | None) -> float | None:
        """Receive syncs until holding ``version``'s weights (None: until stop); the seconds
        spent waiting for headers, or None when stopped."""
        idle = 0.0
        while version is None or self.version < version:
            start = time.perf_counter()
            kind, got = self._guard(0, "waiting for weights", lambda: weight_sync.recv_header(
                self.layout.sync_group, self.ctx.device, self.timeout))
            idle += time.perf_counter() - start
            if kind == weight_sync.STOP:
                return None
            self._guard(0, "receiving weights", lambda: weight_sync.receive(
                self.module, group=self.layout.sync_group, device=self.ctx.device,
                bucket_bytes=self.bucket_bytes, timeout_minutes=self.timeout))
            self.version = got
        if self.backend.behind(self.version):
            self._push_to_backend()
        return idle

    def _push_to_backend(self) -> None:
        """The weights just received to this rank's backend when it samples elsewhere: a
        vLLM server (paused around the reload:
        relax/rollout/backends/vllm/vllm_sync.py), before anything samples with them; its samples
        record the version. Only the versions a batch needs arrive (the schedule follows
        --update-weights-interval), so each is pushed; the initial weights, which the server
        starts with, are not. Recorded for every share: ``vllm/weight_sync_bytes``, and the
        seconds as ``async/rollout_vllm_sync_time``."""
        start = time.perf_counter()
        nbytes = self.backend.push(self.module, self.version)
        seconds = time.perf_counter() - start
        for v in self.shares:
            self.trackers[v].add_max("vllm/weight_sync_bytes", nbytes)
            self.timers[v].add("vllm_sync", seconds)

    def _record_backend(self) -> None:
        """The backend's metrics of the step (its servers') are this rank's, not a share's:
        counted with the first share, the others given the same names at zero (every
        training rank reduces the same names, relax/metrics/tracker.py)."""
        probe = MetricTracker()
        self.backend.record(probe)
        records = probe.export()
        zero = {"sums": {n: [0.0, 0.0] for n in records["sums"]}, "kinds": records["kinds"],
                "max": {n: 0.0 for n in records["max"]}, "global": {}, "ess": {}}
        for k, v in enumerate(self.shares):
            self.trackers[v].merge(records if k == 0 else zero)

    def _guard(self, trainer: int, doing: str, call):
        return naming_the_peer(f"rollout rank {self.layout.rank} {doing}: training rank "
                               f"{trainer}", self.timeout, call)


def serve_rollouts(cfg, ctx: DistContext, layout: AsyncLayout, stop) -> None:
    """A rollout rank's whole run: serve until training rank 0 says stop, then leave with the
    training ranks. A SIGTERM / SIGINT (``stop``) does not end the serving: the training ranks
    finish their step and checkpoint (receiving the batches in flight), then say stop."""
    if ctx.device.type == "cpu":  # the host's cores shared between all local processes
        torch.set_num_threads(cpu_threads(
            local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    # --rollout-backend vllm: this rank's servers, checked before any model loads: the
    # owned servers i, i+R, ... (logs vllm-server<k>.log, weights named by the world rank),
    # or the pool of --vllm-url entries i, i+R, ..., for rollout rank i of R (each server
    # reloaded by one rollout rank, on its schedule). The rank holds the whole model (the
    # weights arrive whole), so it writes them alone even when the training ranks use FSDP2.
    # Closed if anything below fails
    backend = open_backend(cfg.rollout, layout.rank, ctx.device, placement=cfg.placement,
                           model=cfg.model, run=cfg.run, slot=(ctx.rank, layout.rollouts))
    try:
        bf16 = use_bf16(cfg.system.bf16, ctx.device)
        b = cfg.batches
        worker = RolloutWorker(
            ctx, layout, backend, model_dir=cfg.model.hf_checkpoint, lora=cfg.lora,
            seed=cfg.run.seed, bf16=use_rollout_bf16(cfg.rollout.backend.rollout_bf16, bf16),
            bucket_mb=cfg.placement.weight_sync_bucket_mb,
            timeout_minutes=cfg.run.distributed_timeout_minutes,
            rows=b.rollout_batch_size // layout.trainers * b.n_samples_per_prompt)
        side = build_rollout_side(cfg, worker.share_contexts(), device=ctx.device, bf16=bf16,
                                  stop=stop)
        worker.take_side(side, cfg.rollout, cfg.batches, seed=cfg.run.seed)
    except BaseException:
        backend.close()
        raise
    try:
        worker.serve()
    finally:
        worker.close()
    try:
        layout.finish_together()
    except Exception as e:
        if not is_peer_failure(e):
            raise
        raise PeerFailure(f"rollout rank {layout.rank}: the training ranks ended without "
                          "finishing the run (see their message)") from e
    if stop.signum is not None:
        name = signal.Signals(stop.signum).name
        raise Interrupted(stop.signum, f"stopped by {name} once the training ranks had "
                          "saved (see their line)")
