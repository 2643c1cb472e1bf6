"""A seeded run repeats bit for bit on a busy machine, and the README's make-demo row is what
it gives.

Each test starts two identical runs at once, at two intra-op threads each, beside a process
that keeps a core busy in random bursts: on a 2-core machine the runs' threads are then descheduled at random
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
import warnings
from pathlib import Path

import pytest

from tests.trainer.helpers import read_metrics, write_reward

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


# The neighbour spins for a random 1-4 ms, then sleeps for a random 1-8 ms, for ever: about
# 140 wake-ups a second, each taking a core from one of the runs' threads at a random point,
# which is the descheduling at random the test needs, for about a third of a core. A plain
# `while True: pass` held a whole core for the length of each test, CPU taken from the
# suite's other xdist worker (the suite's time is bounded too).
NEIGHBOUR = """
import random, time
while True:
    end = time.perf_counter() + random.uniform(0.001, 0.004)
    while time.perf_counter() < end:
        pass
    time.sleep(random.uniform(0.001, 0.008))
"""


def _busy_neighbour() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", NEIGHBOUR])


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
    every metric at all 200 steps, and its first- and last-5 rewards are the README's row on
    the kind of CPU the README's table names (scripts/readme_defaults.py ``cpu_kind``: another
    vendor or vector width sums in another order, so there the row is not compared, with a
    warning saying so; the two runs still are)."""
    _, flags = readme_defaults.DEMO
    runs = [tmp_path / "a", tmp_path / "b"]
    _both([readme_defaults.train_command(flags, str(r)) for r in runs],
          {**readme_defaults.train_env(), **THREADS})
    _assert_equal(read_metrics(runs[0]), read_metrics(runs[1]))
    first, last = readme_defaults.rewards(runs[0])
    text = readme_defaults.README.read_text(encoding="utf-8")
    measured_on, here = readme_defaults.table_cpu(text), readme_defaults.cpu_kind()
    if measured_on != here:  # another kind sums in another order: the rewards differ, both exact
        warnings.warn(f"README.md's table was measured on CPU {measured_on!r}; this machine is "
                      f"{here!r}, so its rewards ({first:.3f}, {last:.3f}) are not compared "
                      f"with the table (the two runs were)", stacklevel=1)
        return
    written = readme_defaults.table_rows(text)
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


def test_a_moe_run_with_replay_and_a_bf16_sampler_repeats_two_at_a_time_under_load(tmp_path):
    """The tiny Qwen3-MoE with R3, the router's aux loss and a bf16 sampler against the fp32
    trainer (--rollout-bf16), twice at once at two threads beside a busy core: equal in every
    metric. A discrete choice rides on every float here (a last-bit difference in a router's
    logits can flip a token's experts, and from then on the runs part). Each step runs every
    MoE kernel: the bf16 decode and its routing record, the replayed packed passes (two
    optimizer steps per rollout step) and the aux loss's backward. The steps are small: a
    run's CPU time is mostly its start (importing torch and transformers, about 5 of 7 CPU
    seconds on this machine), so 10 steps (20 optimizer steps) cost about 1 s more than 3."""
    from relax.tiny_model import build_tiny_moe, build_tokenizer

    tok, model_dir = build_tokenizer(), tmp_path / "tiny_moe"
    build_tiny_moe(tok, seed=1).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    reward = write_reward(tmp_path)  # the share of odd character codes: a gradient at once
    flags = ["--hf-checkpoint", str(model_dir), "--custom-rm-path", f"{reward}:parity",
             "--use-rollout-routing-replay",
             "--moe-aux-loss-coef", "0.01", "--rollout-bf16", "--num-rollout", "10",
             "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--num-steps-per-rollout", "2", "--rollout-max-response-len", "8",
             "--advantage-estimator", "grpo", "--lr", "1e-3", "--log-samples", "0",
             "--seed", "5"]
    runs = [tmp_path / "a", tmp_path / "b"]
    env = {**os.environ, **THREADS, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")])}
    _both([_relax(r, *flags) for r in runs], env)
    a, b = read_metrics(runs[0]), read_metrics(runs[1])
    assert all(m["train/moe_replayed_routing_mismatch"] == 0.0 for m in a)  # R3 replayed
    assert any(m["train/moe_routing_mismatch"] > 0.0 for m in a)  # the router alone differs
    assert len({m["rollout/raw_reward"] for m in a}) > 1  # a policy gradient moved the policy
    _assert_equal(a, b)


def test_metrics_that_differ_in_the_last_bit_are_caught():
    """The comparison is exact: a last-bit difference in any non-time metric fails it."""
    a = [{"rollout/step": 1, "train/entropy": 4.0757785, "perf/step_time": 1.0}]
    b = [{"rollout/step": 1, "train/entropy": 4.0757787, "perf/step_time": 2.0}]
    with pytest.raises(AssertionError, match="train/entropy"):
        _assert_equal(a, b)
    _assert_equal(a, [dict(a[0], **{"perf/step_time": 9.0})])
