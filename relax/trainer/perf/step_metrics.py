"""The metrics row of one rollout step: what the phases added to the tracker, the generation
counts of the step batch, the phase times (slowest rank) and the distance to the machine's
limits (``perf/*_mfu``, ``perf/generate_bandwidth_fraction``: relax/trainer/perf/flops.py).

``perf/step_time`` = ``perf/rollout_time`` (generate + reward) + ``perf/train_time``
(log_prob + advantage + update) + ``perf/eval_time``; ``perf/generated_tokens_per_s`` is the
global generated tokens over the rollout time. With ``--fully-async`` the rollout time is the
training ranks' wait for their batch; the tokens per second divide by the rollout ranks'
generate time and ``perf/mfu`` counts the training ranks' own passes only.
``perf/peak_tflops`` and ``perf/bandwidth_gb_per_s`` are the limits the fractions divide by
(relax/trainer/perf/limits.py: measured ones are measured again after steps 1, 2, 4, 8, ..., the
best kept); ``perf/over_limit`` counts the fractions above 1, and the first one of a run is
explained in a warning on stderr. Without token budgets, the first step whose
``perf/update_padding_fraction`` exceeds :data:`PADDING_NOTE` (more padded token slots than
tokens in the update) prints one note naming ``--use-dynamic-batch-size``.
"""

from __future__ import annotations

import functools
import sys

from relax.rollout.generation.batch import StepBatch
from relax.rollout.generation.engine import unsupported_reason
from relax.trainer.perf.flops import (
    ModelShape,
    measure_bandwidth,
    measure_peak_flops,
    phase_metrics,
)
from relax.trainer.perf.limits import (
    Limits,
    device_name,
    over_limit,
    over_limit_warning,
    tf32_matmuls,
)
from relax.trainer.policy.packing import packing_supported
from relax.trainer.runtime import peak_memory_gb

# Above this share of padded slots in the update, fixed micro-batches cost more than the tokens
# they hold: 16 responses of up to 1,024 tokens on SmolLM2 padded 56% of the update's slots
# (docs/performance.md, "Where a long step goes")
PADDING_NOTE = 0.5


class StepMetrics:
    """``row(batch, times)``: the reduced metrics of a step (a collective: every rank calls
    it, the result is the same everywhere). ``limits`` holds one device's peak FLOP/s and copy
    bandwidth; ``log_prob_passes`` the no-grad passes a step runs (pi_old, reference)."""

    def __init__(self, tracker, ctx, *, shape: ModelShape, limits: Limits, log_prob_passes: int):
        self.tracker, self.ctx, self.shape = tracker, ctx, shape
        self.limits, self.log_prob_passes = limits, log_prob_passes
        self.warned, self.rows = False, 0
        # --fully-async: rollout ranks generate, so the training ranks' perf/mfu leaves the
        # generation out and the tokens per second divide by the rollout ranks' time
        self.remote_generation = False
        # fixed micro-batches (no --use-dynamic-batch-size): a padding-heavy step gets one note
        self.padding_note = False
        # a group's prompt runs once in the log-prob and update passes (--pass-layout
        # shared-prefix on a model that packs) and in the decode engine's prefill: counted once
        self.shared_passes = False
        self.shared_generation = False

    @classmethod
    def measure(cls, module, tracker, ctx, *, peak_tflops: float | None, bf16: bool,
                log_prob_passes: int, layout: str = "padded") -> StepMetrics:
        """The model's FLOP counts and this device's limits (relax/trainer/perf/limits.py);
        ``layout`` the passes' ``--pass-layout``."""
        limits = Limits.resolve(
            peak_tflops=peak_tflops, device_name=device_name(ctx.device), bf16=bf16,
            tf32=tf32_matmuls(),
            # the per-step measurements repeat less: the best over the run is what counts
            measure_peak=functools.partial(measure_peak_flops, ctx.device, bf16, repeats=2),
            measure_bandwidth=functools.partial(measure_bandwidth, ctx.device, repeats=2))
        metrics = cls(tracker, ctx, shape=ModelShape.of(module), limits=limits,
                      log_prob_passes=log_prob_passes)
        metrics.shared_passes = layout == "shared-prefix" and packing_supported(module)
        metrics.shared_generation = unsupported_reason(module) is None
        return metrics

    def row(self, b: StepBatch, times: dict[str, float]) -> dict[str, float]:
        t, limits = self.tracker, self.limits
        self.rows += 1
        if self.rows & (self.rows - 1) == 0:
            # measured limits again after steps 1, 2, 4, 8, ...: a later quiet moment corrects a
            # start-up measurement on a busy machine, at a cost (about 0.9 s on one CPU thread)
            # that vanishes over a run instead of taxing every step
            limits.refresh()
        # every rank divides by the same limits: the best any rank measured
        t.add_max("perf/peak_tflops", limits.peak / 1e12)
        t.add_max("perf/bandwidth_gb_per_s", limits.bandwidth / 1e9)
        mask = b.generated.response_mask
        t.add_ratio("rollout/response_length", mask.sum(), mask.shape[0])
        t.add_ratio("rollout/truncated", b.generated.truncated.sum(), mask.shape[0])
        t.add_sum("perf/generated_tokens", mask.sum())
        for name, seconds in times.items():  # the slowest rank sets the pace of a step
            t.add_max(f"perf/{name}_time", seconds)
        t.add_max("perf/peak_memory_gb", peak_memory_gb(self.ctx.device))
        t.add_sum("perf/forward_flops", self._forward_flops(b.rollout, self.shared_passes))
        t.add_sum("perf/generate_flops", 0.0 if self.remote_generation
                  else self._forward_flops(b.generated, self.shared_generation))
        metrics = t.reduce()
        limits.peak = metrics["perf/peak_tflops"] * 1e12
        limits.bandwidth = metrics["perf/bandwidth_gb_per_s"] * 1e9
        metrics.update(phase_metrics(
            metrics.pop("perf/forward_flops"), log_prob_passes=self.log_prob_passes,
            generate_forward=metrics.pop("perf/generate_flops"),
            skipped_fraction=metrics.get("perf/backward_skipped_fraction", 0.0),
            times={k: metrics.get(f"perf/{k}_time", 0.0)
                   for k in ("step", "update", "log_prob", "generate")},
            peak_flops=limits.peak * self.ctx.world_size, decode_steps=b.decode_steps,
            weight_bytes=self.shape.weight_bytes, bandwidth=limits.bandwidth))
        self._explain_over_limit(metrics)
        self._note_padding(metrics)
        generating = metrics.get("async/rollout_generate_time", metrics["perf/rollout_time"])
        metrics["perf/generated_tokens_per_s"] = metrics.pop("perf/generated_tokens") / max(
            generating, 1e-9)
        return metrics

    def _explain_over_limit(self, metrics: dict[str, float]) -> None:
        """``perf/over_limit``: the fractions above 1 this step, the first explained once."""
        metrics["perf/over_limit"] = float(len(over_limit(metrics)))
        if metrics["perf/over_limit"] and not self.warned:
            self.warned = True
            if self.ctx.is_main:
                print(over_limit_warning(metrics, self.limits), file=sys.stderr, flush=True)

    def _note_padding(self, metrics: dict[str, float]) -> None:
        """Once per run: most of the update's token slots were padding."""
        share = metrics.get("perf/update_padding_fraction", 0.0)
        if not self.padding_note or share <= PADDING_NOTE:
            return
        self.padding_note = False
        if self.ctx.is_main:
            print(f"relax train: note: {share:.0%} of the update's token slots were padding "
                  "(perf/update_padding_fraction): responses of very different lengths share "
                  "fixed micro-batches; --use-dynamic-batch-size --max-tokens-per-gpu N groups "
                  "rows of similar length (N a few times the longest prompt + response), with "
                  "the same loss (docs/performance.md, 'Where a long step goes'); said once per "
                  "run", file=sys.stderr, flush=True)

    def _forward_flops(self, r, shared: bool) -> float:
        # an episode's training forward also runs over the environment's tokens
        responses = (r.response_mask if r.context_mask is None else r.context_mask).sum(-1)
        if shared:
            return self.shape.shared_forward_flops(r.prompt_ids, r.prompt_mask, responses)
        return self.shape.forward_flops(r.prompt_mask.sum(-1) + responses, responses)

