"""A seeded run repeats bit for bit on a busy machine, and the README's make-demo row is what
it gives.

Each test starts two identical runs at once, at two intra-op threads each, beside a process
that keeps a core busy: on a 2-core machine the runs' threads are then descheduled at random
points, which is what exposed a kernel whose result depended on thread timing (the backward
of the pack's gathers, relax/trainer/policy/packing.py ``take``: seeded default runs drifted apart at
steps 14-23). Every metric that is not a time must be equal, not close, at every step, and
enough steps run for a last-bit drift to show (the default run: 200; the others 40).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.trainer.helpers import read_metrics

pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(1500)]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import readme_defaults  # noqa: E402  (scripts/ is not a package)

# OpenMP's threads sleep at a barrier instead of spinning (OMP_WAIT_POLICY changes no
# arithmetic, only how an idle thread waits): with five busy threads on two cores, spinning
# threads burned the slices their partners needed and the demo pair took 582 s in CI
THREADS = {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
# more threads than the 2 cores: descheduled all the time
THREADS_4 = {"OMP_NUM_THREADS": "4", "OMP_WAIT_POLICY": "PASSIVE"}
WAIT_S = 1200  # per pair of runs; a hang fails the test with the runs' stderr
TIMES = ("perf/", "async/rollout_", "async/train_", "async/weight_sync_time",
         "vllm/weight_sync_time")


def _busy_neighbour() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def _both(commands: list[list[str]], env: dict) -> None:
    """Run the commands at once beside a busy process; every one must exit 0 in time."""
    neighbour = _busy_neighbour()
    procs = [subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True) for c in commands]
    deadline = time.monotonic() + WAIT_S
    try:
        errors = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[1]
                  for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"the runs did not finish within {WAIT_S} s (hang?)")
    finally:
        for p in [*procs, neighbour]:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, err in zip(procs, errors, strict=True):
        assert p.returncode == 0, err[-4000:]


def _assert_equal(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b, strict=True):
        keys = sorted(k for k in x.keys() | y.keys() if not k.startswith(TIMES)
                      and not k.endswith("_time"))
        for key in keys:
            u, v = x.get(key), y.get(key)
            same = u == v or (isinstance(u, float) and isinstance(v, float)
                              and math.isnan(u) and math.isnan(v))
            assert same, f"step {x.get('rollout/step')}: {key} {u!r} != {v!r}"


def test_the_demo_repeats_two_at_a_time_under_load_and_gives_the_readme_row(tmp_path):
    """``make demo`` (``relax train``, no flags) twice at once beside a busy core: equal in
    every metric at all 200 steps, and its first- and last-5 rewards are the README's row."""
    _, flags = readme_defaults.DEMO
    runs = [tmp_path / "a", tmp_path / "b"]
    _both([readme_defaults.train_command(flags, str(r)) for r in runs],
          {**readme_defaults.train_env(), **THREADS})
    _assert_equal(read_metrics(runs[0]), read_metrics(runs[1]))
    first, last = readme_defaults.rewards(runs[0])
    written = readme_defaults.table_rows(readme_defaults.README.read_text(encoding="utf-8"))
    label = readme_defaults.DEMO[0]
    assert written.get(label) == (f"{first:.3f}", f"{last:.3f}"), (
        f"README.md's make-demo row says {written.get(label)}, the demo gives "
        f"({first:.3f}, {last:.3f}): run scripts/readme_defaults.py")


def _relax(out: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "relax", "train", *flags, "--output-dir", str(out)]


def test_an_env_run_repeats_two_at_a_time_under_load(tmp_path):
    """Episodes (``--env``, several turns, the shared-prefix passes over each episode's
    turns) at four threads, twice at once beside a busy core: equal in every metric."""
    flags = ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3", "--num-rollout",
             "40", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--rollout-max-response-len", "4", "--log-samples", "0", "--seed", "7"]
    runs = [tmp_path / "a", tmp_path / "b"]
    env = {**os.environ, **THREADS_4, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    _both([_relax(r, *flags) for r in runs], env)
    _assert_equal(read_metrics(runs[0]), read_metrics(runs[1]))


# each correction and length control of the fully-async pair, and the metric that shows it acted
# (reinforce_plus_plus.md §7c, §7d): a nonzero value at some step of the run
FIRED = {"train/rollout_is_truncated_fraction": "--rollout-is sequence (truncate, 1.2)",
         "train/rollout_rs_masked_fraction": "--rollout-rs token (IcePop, 1.05)",
         "rollout/overlong_penalty": "--overlong-buffer-len 2",
         "rollout/overlong_filtered_fraction": "--overlong-filter"}


def test_a_fully_async_lag_one_run_repeats_two_at_a_time_under_load(tmp_path):
    """``--fully-async --max-staleness 1`` (a training rank and a rollout rank under torchrun)
    with a sequence-level importance weight, IcePop rejection, the soft overlong punishment
    and the overlong filter (§7c, §7d), at two threads per rank, two jobs at once beside a
    busy core: each of the four acts (its metric is nonzero at some step) and the runs are
    equal in every metric. The thresholds are tight (1.2, 1.05) so that the lag of one step
    alone moves ratios past them; a 5-token limit with a 2-token buffer makes the tiny
    model's responses overlong."""
    flags = ["--fully-async", "--max-staleness", "1", "--rollout-is", "sequence",
             "--rollout-is-threshold", "1.2", "--rollout-rs", "token",
             "--rollout-rs-threshold", "1.05", "--overlong-buffer-len", "2", "--overlong-filter",
             "--num-rollout", "40", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--rollout-max-response-len", "5", "--log-samples", "0", "--seed", "3"]
    runs = [tmp_path / "a", tmp_path / "b"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "-m", "relax", "train"]
    _both([[*torchrun, *flags, "--output-dir", str(r)] for r in runs], {**os.environ, **THREADS})
    a, b = read_metrics(runs[0]), read_metrics(runs[1])
    assert max(m.get("async/staleness", 0) for m in a) == 1  # trained one step behind
    for key, flag in FIRED.items():
        assert any(m.get(key, 0) != 0 for m in a), f"{flag} never acted: {key} is 0 throughout"
    _assert_equal(a, b)


def test_metrics_that_differ_in_the_last_bit_are_caught():
    """The comparison is exact: a last-bit difference in any non-time metric fails it."""
    a = [{"rollout/step": 1, "train/entropy": 4.0757785, "perf/step_time": 1.0}]
    b = [{"rollout/step": 1, "train/entropy": 4.0757787, "perf/step_time": 2.0}]
    with pytest.raises(AssertionError, match="train/entropy"):
        _assert_equal(a, b)
    _assert_equal(a, [dict(a[0], **{"perf/step_time": 9.0})])
