"""The machine's limits that ``perf/*_mfu`` and ``perf/generate_bandwidth_fraction`` divide by,
chosen so that they hold on a shared machine (docs/performance.md, "Distance to the limit").

Peak FLOP/s per rank, first that applies: ``--peak-tflops``; ``RELAX_PEAK_TFLOPS``; the data
sheet's dense figure of a known GPU in the run's compute dtype (``KNOWN_GPUS``); else measured
(relax/trainer/perf/flops.py), at start-up and again at every step, keeping the best. Copy bandwidth
likewise: ``RELAX_MEMORY_BANDWIDTH_GBPS``, a known GPU's figure, else the best measurement.

A measurement taken while another job shares the cores comes out low, and every fraction
divided by it high: keeping the best of the whole run converges to the quiet machine's figure
as soon as one of the repeated measurements (after steps 1, 2, 4, 8, ...) finds the cores free. A fraction that still exceeds 1 is
reported with ``perf/over_limit`` (how many of the step's fractions exceed 1) and one warning
that says which limit and why (``over_limit_warning``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from relax.trainer.perf.flops import BANDWIDTH_ENV, PEAK_ENV, given_limit

# (name fragment of torch.cuda.get_device_name, dense TFLOP/s in bf16, fp32, tf32, GB/s):
# NVIDIA's data sheets, without sparsity. Matched in order, the more specific name first
# ("H100 NVL" and "H100 PCIe" before "H100", the SXM part's name "NVIDIA H100 80GB HBM3").
KNOWN_GPUS = (
    ("H200 NVL", 835.0, 60.0, 418.0, 4800.0),
    ("H200", 989.0, 67.0, 495.0, 4800.0),
    ("H100 NVL", 835.0, 60.0, 418.0, 3900.0),
    ("H100 PCIe", 756.0, 51.0, 378.0, 2000.0),
    ("H100", 989.0, 67.0, 495.0, 3350.0),
    ("A100 80GB PCIe", 312.0, 19.5, 156.0, 1935.0),
    ("A100-SXM4-80GB", 312.0, 19.5, 156.0, 2039.0),
    ("A100", 312.0, 19.5, 156.0, 1555.0),  # the 40 GB parts, SXM4 and PCIe
    ("L40S", 362.0, 91.6, 183.0, 864.0),
    ("L4", 121.0, 30.3, 60.0, 300.0),
)

FRACTIONS = ("perf/mfu", "perf/update_mfu", "perf/log_prob_mfu",
             "perf/generate_bandwidth_fraction")


def published(device_name: str, bf16: bool, tf32: bool) -> tuple[float, float] | None:
    """(peak FLOP/s, bandwidth bytes/s) of a GPU named ``device_name`` in the compute dtype
    (fp32 matmuls run as TF32 when ``tf32``), None when it is not in ``KNOWN_GPUS``."""
    for fragment, bf16_tf, fp32_tf, tf32_tf, gbps in KNOWN_GPUS:
        if fragment in device_name:
            tflops = bf16_tf if bf16 else tf32_tf if tf32 else fp32_tf
            return tflops * 1e12, gbps * 1e9
    return None


@dataclass
class Limits:
    """One rank's peak FLOP/s and copy bandwidth (bytes/s) and where each came from
    (``"flag"``, ``"environment"``, ``"data sheet"`` or ``"measured"``). The measured ones
    are refreshed by ``refresh`` with the given measurement callables."""

    peak: float
    bandwidth: float
    peak_source: str
    bandwidth_source: str
    measure_peak: Callable[[], float] | None = None
    measure_bandwidth: Callable[[], float] | None = None

    @classmethod
    def resolve(cls, *, peak_tflops: float | None, device_name: str | None, bf16: bool,
                tf32: bool, measure_peak: Callable[[], float],
                measure_bandwidth: Callable[[], float]) -> Limits:
        """The start-up limits (see the module docstring for the order); ``device_name`` is
        None off CUDA. The measurement callables run only for a limit nothing else gives."""
        sheet = published(device_name, bf16, tf32) if device_name else None
        peak_env, bw_env = given_limit(PEAK_ENV), given_limit(BANDWIDTH_ENV)
        peak, peak_source, again = _first_given(
            flag=peak_tflops * 1e12 if peak_tflops else None,
            environment=None if peak_env is None else peak_env * 1e12,
            sheet=None if sheet is None else sheet[0], measure=measure_peak)
        bw, bw_source, bw_again = _first_given(
            flag=None, environment=None if bw_env is None else bw_env * 1e9,
            sheet=None if sheet is None else sheet[1], measure=measure_bandwidth)
        return cls(peak, bw, peak_source, bw_source, again, bw_again)

    def refresh(self) -> None:
        """Measure again what was measured, keeping the best of all measurements so far."""
        if self.measure_peak is not None:
            self.peak = max(self.peak, self.measure_peak())
        if self.measure_bandwidth is not None:
            self.bandwidth = max(self.bandwidth, self.measure_bandwidth())


def _first_given(*, flag, environment, sheet, measure):
    """``(value, source, measure again or None)``: the first limit given, else measured."""
    for value, source in ((flag, "flag"), (environment, "environment"), (sheet, "data sheet")):
        if value is not None:
            return value, source, None
    return measure(), "measured", measure


def over_limit(metrics: dict[str, float]) -> list[str]:
    """The names of the fractions in ``metrics`` above 1."""
    return [name for name in FRACTIONS if metrics.get(name, 0.0) > 1.0]


def over_limit_warning(metrics: dict[str, float], limits: Limits) -> str:
    """Why the fractions ``over_limit(metrics)`` names exceed 1, in one line."""
    names = over_limit(metrics)
    shown = ", ".join(f"{n} = {metrics[n]:.2f}" for n in names)
    flops = [n for n in names if n.endswith("mfu")]
    source = (limits.peak_source if flops else limits.bandwidth_source)
    limit = (f"peak {limits.peak / 1e12:.3g} TFLOP/s" if flops
             else f"copy bandwidth {limits.bandwidth / 1e9:.3g} GB/s")
    if source == "measured":
        why = ("the machine was busy at every measurement so far (the best of the start-up "
               "and per-step measurements is kept); give the data sheet's figure with "
               f"{'--peak-tflops or ' + PEAK_ENV if flops else BANDWIDTH_ENV}")
    else:
        why = (f"the {source}'s figure is below what the step achieved, or the FLOP count "
               "overstates the work (full n x n attention, a shared prompt counted per row)"
               if flops else f"the {source}'s figure is below what the decode achieved")
    return (f"relax train: warning: {shown} above 1 against the {source} {limit}: {why} "
            "(docs/performance.md, 'Distance to the limit'); warned once per run")


def device_name(device: torch.device) -> str | None:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def tf32_matmuls() -> bool:
    """fp32 matmuls run as TF32 (``torch.set_float32_matmul_precision`` below highest)."""
    return torch.get_float32_matmul_precision() != "highest"
