"""The metrics row of one rollout step: what the phases added to the tracker, the generation
counts of the step batch, the phase times (slowest rank) and the distance to the machine's
limits (``perf/*_mfu``, ``perf/generate_bandwidth_fraction``: relax/trainer/flops.py).

``perf/step_time`` = ``perf/rollout_time`` (generate + reward) + ``perf/train_time``
(log_prob + advantage + update) + ``perf/eval_time``; ``perf/generated_tokens_per_s`` is the
global generated tokens over the rollout time. With ``--fully-async`` the rollout time is the
training ranks' wait for their batch; the tokens per second divide by the rollout ranks'
generate time and ``perf/mfu`` counts the training ranks' own passes only.
"""

from __future__ import annotations

from relax.rollout.batch import StepBatch
from relax.trainer.flops import ModelShape, measure_bandwidth, measure_peak_flops, phase_metrics
from relax.trainer.runtime import peak_memory_gb


class StepMetrics:
    """``row(batch, times)``: the reduced metrics of a step (a collective: every rank calls
    it, the result is the same everywhere). ``peak_flops`` is one device's, ``bandwidth`` its
    copy bandwidth; ``log_prob_passes`` the no-grad passes a step runs (pi_old, reference)."""

    def __init__(self, tracker, ctx, *, shape: ModelShape, peak_flops: float, bandwidth: float,
                 log_prob_passes: int):
        self.tracker, self.ctx, self.shape = tracker, ctx, shape
        self.peak_flops, self.bandwidth = peak_flops, bandwidth
        self.log_prob_passes = log_prob_passes
        # --fully-async: rollout ranks generate, so the training ranks' perf/mfu leaves the
        # generation out and the tokens per second divide by the rollout ranks' time
        self.remote_generation = False

    @classmethod
    def measure(cls, module, tracker, ctx, *, peak_tflops: float | None, bf16: bool,
                log_prob_passes: int) -> StepMetrics:
        """The model's FLOP counts and this device's peak (``--peak-tflops`` or measured) and
        copy bandwidth."""
        peak = peak_tflops * 1e12 if peak_tflops else measure_peak_flops(ctx.device, bf16)
        return cls(tracker, ctx, shape=ModelShape.of(module), peak_flops=peak,
                   bandwidth=measure_bandwidth(ctx.device), log_prob_passes=log_prob_passes)

    def row(self, b: StepBatch, times: dict[str, float]) -> dict[str, float]:
        t = self.tracker
        mask = b.generated.response_mask
        t.add_ratio("rollout/response_length", mask.sum(), mask.shape[0])
        t.add_ratio("rollout/truncated", b.generated.truncated.sum(), mask.shape[0])
        t.add_sum("perf/generated_tokens", mask.sum())
        for name, seconds in times.items():  # the slowest rank sets the pace of a step
            t.add_max(f"perf/{name}_time", seconds)
        t.add_max("perf/peak_memory_gb", peak_memory_gb(self.ctx.device))
        t.add_sum("perf/forward_flops", self._forward_flops(b.rollout))
        t.add_sum("perf/generate_flops",
                  0.0 if self.remote_generation else self._forward_flops(b.generated))
        metrics = t.reduce()
        metrics.update(phase_metrics(
            metrics.pop("perf/forward_flops"), log_prob_passes=self.log_prob_passes,
            generate_forward=metrics.pop("perf/generate_flops"),
            skipped_fraction=metrics.get("perf/backward_skipped_fraction", 0.0),
            times={k: metrics.get(f"perf/{k}_time", 0.0)
                   for k in ("step", "update", "log_prob", "generate")},
            peak_flops=self.peak_flops * self.ctx.world_size, decode_steps=b.decode_steps,
            weight_bytes=self.shape.weight_bytes, bandwidth=self.bandwidth))
        # the limits the ratios divide by, so a reader of metrics.jsonl can check them
        metrics["perf/peak_tflops"] = self.peak_flops / 1e12
        metrics["perf/bandwidth_gb_per_s"] = self.bandwidth / 1e9
        generating = metrics.get("async/rollout_generate_time", metrics["perf/rollout_time"])
        metrics["perf/generated_tokens_per_s"] = metrics.pop("perf/generated_tokens") / max(
            generating, 1e-9)
        return metrics

    def _forward_flops(self, r) -> float:
        # an episode's training forward also runs over the environment's tokens
        responses = (r.response_mask if r.context_mask is None else r.context_mask).sum(-1)
        return self.shape.forward_flops(r.prompt_mask.sum(-1) + responses, responses)

