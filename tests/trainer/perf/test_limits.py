"""The limits perf/*_mfu divide by hold on a shared machine (relax/trainer/perf/limits.py): the
order of the sources, the best of the start-up and per-step measurements, and a fraction above
1 counted in perf/over_limit and explained once. Measurements are injected, never timed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from relax.metrics.tracker import MetricTracker
from relax.rollout.generation.batch import StepBatch
from relax.rollout.generation.generate import Rollout
from relax.trainer.perf.flops import BANDWIDTH_ENV, PEAK_ENV, ModelShape
from relax.trainer.perf.limits import Limits, over_limit_warning, published
from relax.trainer.perf.step_metrics import StepMetrics


def never():
    raise AssertionError("measured although the limit was given")


def sequence(*values):
    it = iter(values)
    return lambda: next(it)


@pytest.mark.parametrize("name, bf16, tf32, tflops, gbps", [
    ("NVIDIA H100 80GB HBM3", True, False, 989, 3350),
    ("NVIDIA H100 80GB HBM3", False, False, 67, 3350),
    ("NVIDIA H100 80GB HBM3", False, True, 495, 3350),
    ("NVIDIA H100 PCIe", True, False, 756, 2000),
    ("NVIDIA H200", True, False, 989, 4800),
    ("NVIDIA A100-SXM4-80GB", True, False, 312, 2039),
    ("NVIDIA A100-SXM4-40GB", False, False, 19.5, 1555),
])
def test_data_sheet_figures_of_known_gpus(name, bf16, tf32, tflops, gbps):
    assert published(name, bf16, tf32) == (tflops * 1e12, gbps * 1e9)


def test_an_unknown_device_has_no_data_sheet_figure():
    assert published("NVIDIA GeForce GTX 1080", True, False) is None


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(PEAK_ENV, raising=False)
    monkeypatch.delenv(BANDWIDTH_ENV, raising=False)


def resolve(**kw):
    args = dict(peak_tflops=None, device_name=None, bf16=False, tf32=False,
                measure_peak=never, measure_bandwidth=never)
    return Limits.resolve(**{**args, **kw})


def test_sources_in_order_and_given_limits_are_not_measured(no_env, monkeypatch):
    flag = resolve(peak_tflops=2.0, device_name="NVIDIA H100 80GB HBM3", bf16=True)
    assert (flag.peak, flag.peak_source) == (2e12, "flag")
    assert (flag.bandwidth, flag.bandwidth_source) == (3350e9, "data sheet")
    sheet = resolve(device_name="NVIDIA H100 80GB HBM3", bf16=True)
    assert (sheet.peak, sheet.peak_source) == (989e12, "data sheet")
    monkeypatch.setenv(PEAK_ENV, "3")
    monkeypatch.setenv(BANDWIDTH_ENV, "7")
    env = resolve(device_name="NVIDIA H100 80GB HBM3", bf16=True)
    assert (env.peak, env.peak_source, env.bandwidth) == (3e12, "environment", 7e9)
    env.refresh()  # nothing was measured, so nothing is measured again
    assert (env.peak, env.bandwidth) == (3e12, 7e9)


def test_the_best_of_the_start_up_and_later_measurements_is_kept(no_env):
    limits = resolve(measure_peak=sequence(0.06e12, 0.167e12, 0.1e12),
                     measure_bandwidth=sequence(5e9, 4e9, 9e9))
    assert (limits.peak, limits.peak_source, limits.bandwidth) == (0.06e12, "measured", 5e9)
    limits.refresh()
    assert (limits.peak, limits.bandwidth) == (0.167e12, 5e9)
    limits.refresh()  # a busier moment lowers nothing
    assert (limits.peak, limits.bandwidth) == (0.167e12, 9e9)


def batch(B: int = 2, P: int = 3, T: int = 4) -> StepBatch:
    ones = torch.ones(B, P, dtype=torch.bool)
    rollout = Rollout(torch.ones(B, P, dtype=torch.long), ones,
                      torch.ones(B, T, dtype=torch.long), torch.ones(B, T, dtype=torch.bool),
                      torch.zeros(B, dtype=torch.bool))
    return StepBatch.of(prompts=["p"] * B, labels=[None] * B, group_index=torch.arange(B),
                        rollout=rollout, responses=["r"] * B, rewards=torch.zeros(B))


def test_a_busy_start_up_is_reported_above_1_once_then_corrected(no_env, capsys):
    """A hand run: the start-up measured 0.06 TFLOP/s on a busy machine, the update
    achieved more; the step says so (perf/over_limit, one warning), and a later
    measurement on a quiet machine (after step 4) brings every fraction back below 1 without
    a warning."""
    shape = ModelShape(body_weights=10**6, head_weights=0, layers=1, attn_width=8,
                       weight_bytes=4 * 10**6)
    b = batch()
    forward = shape.forward_flops(torch.full((2,), 7), torch.full((2,), 4))
    # the update (3 forwards) runs at 0.068 TFLOP/s
    times = {"step": 10.0, "update": 3 * forward / 0.068e12, "generate": 1.0, "rollout": 1.0}
    # start-up, then the measurements after steps 1, 2 and 4
    limits = resolve(measure_peak=sequence(0.06e12, 0.06e12, 0.06e12, 0.167e12),
                     measure_bandwidth=sequence(1e12, 1e12, 1e12, 1e12))
    ctx = SimpleNamespace(device=torch.device("cpu"), world_size=1, is_main=True)
    metrics = StepMetrics(MetricTracker(), ctx, shape=shape, limits=limits, log_prob_passes=0)
    first = metrics.row(b, dict(times))
    assert first["perf/update_mfu"] == pytest.approx(0.068 / 0.06)
    assert first["perf/over_limit"] == 1.0 and first["perf/peak_tflops"] == pytest.approx(0.06)
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "perf/update_mfu = 1.13" in err
    assert "--peak-tflops" in err and "measured" in err
    again = metrics.row(b, dict(times))  # still busy: counted, not warned again
    assert again["perf/over_limit"] == 1.0 and capsys.readouterr().err == ""
    # measured again after steps 1, 2, 4, 8, ...: step 3 keeps step 2's figure
    assert metrics.row(b, dict(times))["perf/peak_tflops"] == pytest.approx(0.06)
    capsys.readouterr()
    quiet = metrics.row(b, dict(times))  # step 4: the quiet measurement
    assert quiet["perf/peak_tflops"] == pytest.approx(0.167)
    assert quiet["perf/update_mfu"] == pytest.approx(0.068 / 0.167)
    assert quiet["perf/over_limit"] == 0.0 and capsys.readouterr().err == ""


def test_a_given_figure_below_the_achieved_rate_names_its_source(no_env):
    limits = resolve(peak_tflops=1.0, device_name="NVIDIA L4", bf16=True)
    line = over_limit_warning({"perf/mfu": 1.5, "perf/update_mfu": 0.5}, limits)
    assert "perf/mfu = 1.50" in line and "perf/update_mfu" not in line
    assert "the flag's figure" in line and "FLOP count overstates" in line
    bw = over_limit_warning({"perf/generate_bandwidth_fraction": 1.2}, limits)
    assert "data sheet" in bw and "300 GB/s" in bw
