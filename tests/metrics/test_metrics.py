"""Metric reduction across ranks in one place, and the sinks rank 0 writes."""

import io
import json

import pytest

from relax.metrics.sinks import ConsoleSink, JsonlSink, build_logger, summary_line
from relax.metrics.tracker import MetricTracker
from tests.distributed_utils import run_distributed
from tests.metrics.workers import reduce_on_two_ranks


@pytest.mark.subprocess
def test_reduction_over_two_gloo_ranks():
    results = run_distributed(reduce_on_two_ranks, 2, timeout=60)
    expected = {"perf/generated_tokens": 40.0, "rollout/response_length": 5.0,
                "perf/step_time": 1.5, "rollout/raw_reward": 0.25, "train/loss": 1.5,
                "train/rollout_is_ess": 0.6}
    for got in results:  # every rank gets the same global values
        assert got == pytest.approx(expected)


def test_single_process_and_reset():
    t = MetricTracker()
    t.add_ratio("a", 3, 4)
    t.add_ratio("a", 1, 4)
    t.add_max("m", 2.0)
    t.add_max("m", 1.0)
    assert t.reduce() == {"a": 0.5, "m": 2.0}
    assert t.reduce() == {}  # reset after each rollout step


def test_effective_sample_size_from_global_sums():
    """(sum w)^2 / (n sum w^2) of the weights 0.5, 1, 2 (by hand: 12.25 / (3 * 5.25)), split
    over two records and carried through export/merge; 1 for equal weights, 0 when all are 0,
    NaN without tokens."""
    t = MetricTracker()
    t.add_ess("w", 1, 0.5, 0.25)
    other = MetricTracker()
    other.add_ess("w", 2, 3.0, 5.0)
    other.add_ess("equal", 4, 4.0, 4.0)
    other.add_ess("zero", 2, 0.0, 0.0)
    other.add_ess("none", 0, 0.0, 0.0)
    t.merge(other.export())
    got = t.reduce()
    assert got["w"] == pytest.approx(12.25 / (3 * 5.25), rel=1e-12)
    assert got["equal"] == 1.0 and got["zero"] == 0.0 and got["none"] != got["none"]


def test_one_name_one_kind():
    t = MetricTracker()
    t.add_sum("x", 1)
    with pytest.raises(ValueError, match="recorded as sum and as max"):
        t.add_max("x", 1)


def test_jsonl_one_object_per_step(tmp_path):
    sink = JsonlSink(str(tmp_path / "m" / "metrics.jsonl"))
    sink.log(1, {"rollout/raw_reward": 0.5, "train/loss": float("nan")})
    sink.log(2, {"rollout/raw_reward": 0.75})
    sink.close()
    rows = [json.loads(x) for x in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()]
    assert rows == [{"rollout/step": 1, "rollout/raw_reward": 0.5, "train/loss": None},
                    {"rollout/step": 2, "rollout/raw_reward": 0.75}]


def test_tensorboard_writes_events(tmp_path):
    logger = build_logger(is_main=True, output_dir=str(tmp_path), total_steps=2, console=False,
                          tensorboard=True)
    logger.log(1, {"rollout/raw_reward": 0.5})
    logger.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("rollout/raw_reward")] == [0.5]


def test_non_main_rank_writes_nothing(tmp_path):
    logger = build_logger(is_main=False, output_dir=str(tmp_path), total_steps=2)
    logger.log(1, {"x": 1.0})
    logger.close()
    assert list(tmp_path.iterdir()) == []


def test_console_summary_line():
    line = summary_line(3, 30, {"rollout/raw_reward": 0.4567, "train/pg_loss": -0.01,
                                "perf/step_time": 0.5, "unlisted": 1.0})
    assert line == "step 3/30 | reward 0.457 | pg -0.0100 | s 0.50"
    stream = io.StringIO()
    sink = ConsoleSink(2, stream=stream)
    sink.log(1, {"rollout/raw_reward": 1.0})
    sink.close()
    assert "step 1/2 | reward 1.000" in stream.getvalue()
