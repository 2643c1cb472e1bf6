"""``relax train --env``: training on episodes end to end on the built-in tiny model, with a
scripted in-process environment (tests/rollout/agents/scripted.py)."""

import json
import math
import os
import subprocess
import sys

import pytest

from relax.config import ConfigError
from relax.errors import RewardError
from tests.distributed_utils import torchrun_relax
from tests.rollout.agents import scripted
from tests.trainer.helpers import RECIPES, fit, make_config, read_metrics

ENV = ["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "3"]




@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline",
                                       "grpo"])
def test_episode_rewards_reach_the_estimator(estimator, tmp_path):
    scripted.REWARDS.clear()
    cfg = make_config(*RECIPES[estimator], *ENV, output_dir=tmp_path / "run")
    _, _, moved = fit(cfg)
    assert moved > 1e-4, "the update did not change the parameters"
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    per_step = len(scripted.REWARDS) // 2
    assert per_step == 16  # 4 prompts x 4 episodes, each ended by the environment
    for k, row in enumerate(rows):
        step_rewards = scripted.REWARDS[k * per_step:(k + 1) * per_step]
        # the episode reward, as the environment summed it, is the estimator's raw reward
        assert row["rollout/raw_reward"] == pytest.approx(sum(step_rewards) / per_step)
        assert row["rollout/episode_turns"] == 3.0 and row["rollout/truncated"] == 0.0
        # model tokens only: 3 turns of 1-4 tokens
        assert 3 <= row["rollout/response_length"] <= 12
        for name in ("rollout/advantages", "train/pg_loss", "train/grad_norm"):
            assert math.isfinite(row[name]), name
    with open(tmp_path / "run" / "samples.jsonl") as f:
        sample = json.loads(f.readline())
    # a whole episode: the environment's turns are in the transcript
    assert "T-2" in sample["response"] and "T-1" in sample["response"]
    assert sample["label"]["turns"] == 3 and sample["prompt"].startswith("go")


def test_environments_that_reseed_global_random_change_nothing(tmp_path):
    """gem and textarena call random.seed on reset; the trainer's draws must not follow."""
    samples = []
    for name in ("countdown", "quiet_countdown"):
        cfg = make_config("--env", f"tests.rollout.agents.scripted:{name}", "--max-turns", "3",
                          "--log-samples", "16", output_dir=tmp_path / name)
        fit(cfg)
        with open(tmp_path / name / "samples.jsonl") as f:
            rows = [json.loads(line) for line in f]
        samples.append([(r["response"], r["label"]["env_seed"]) for r in rows])
    assert samples[0] == samples[1]
    seeds = [s for _, s in samples[0]]
    assert len(set(seeds)) > 2  # groups and steps get different environment seeds


def test_a_raising_environment_stops_the_run_or_scores_zero(tmp_path):
    cfg = make_config("--env", "tests.rollout.agents.scripted:broken", output_dir=tmp_path / "a")
    with pytest.raises(RewardError, match="the environment raised RuntimeError: the game"):
        fit(cfg)
    cfg = make_config("--env", "tests.rollout.agents.scripted:broken", "--reward-error-policy", "zero",
                      output_dir=tmp_path / "b")
    fit(cfg)
    rows = read_metrics(tmp_path / "b")
    assert all(r["rollout/reward_errors"] > 0 for r in rows)


@pytest.mark.parametrize("flags,match", [
    (["--env", "nosuchlib:make"], "module 'nosuchlib' not found"),
    (["--env", "gymnasium:CartPole-v1"], "expected gem:ID, textarena:ID"),
    (["--env", "justaname"], "expected gem:ID, textarena:ID"),
    (["--env", "gem:"], "expected gem:ENVIRONMENT_ID"),
    (["--max-turns", "2"], "only applies to --env"),
    (["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "0"], "must be >= 1"),
    (["--env", "tests.rollout.agents.scripted:countdown", "--rm-type", "math"], "remove --rm-type"),
    (["--env", "tests.rollout.agents.scripted:countdown", "--fsdp"], "remove --fsdp"),
])
def test_bad_env_flags_are_rejected(flags, match, tmp_path):
    with pytest.raises(ConfigError, match=match):
        make_config(*flags, output_dir=tmp_path)


def test_a_missing_library_is_named(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "textarena" else real(name, *a))
    with pytest.raises(ConfigError, match=r"--env textarena:X-v0: the textarena library is not "
                       r"installed; make install in a clone brings it"):
        make_config("--env", "textarena:X-v0", output_dir=tmp_path)


def _cli(tmp_path, *flags, timeout=120):
    cmd = [sys.executable, "-m", "relax", "train", *flags, "--num-rollout", "1", "--device",
           "cpu", "--output-dir", str(tmp_path / "run")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.subprocess
def test_a_factory_without_step_exits_2(tmp_path):
    proc = _cli(tmp_path, "--env", "tests.rollout.agents.scripted:no_step")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("relax train: error: --env tests.rollout.agents.scripted:no_step: "
                                "what the factory returned (object) has no reset() method")


@pytest.mark.subprocess
def test_two_process_gloo_episodes(tmp_path):
    """Each rank plays its own episodes; metrics are global, the run ends within a bound."""
    out = tmp_path / "run"
    proc = torchrun_relax(*RECIPES["reinforce_plus_plus_baseline"], *ENV, "--num-rollout", "2",
                          "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
                          "--rollout-max-response-len", "4", "--device", "cpu", "--output-dir",
                          str(out), "--eval-interval", "2", "--eval-episodes", "5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["rollout/episode_turns"] == 3.0
        assert abs(r["rollout/advantage_normalized_mean"]) < 1e-5
        # 16 episodes over both ranks, 3 turns of 1-4 model tokens each
        assert 48 <= r["rollout/valid_tokens"] <= 192
    # the held-out episodes split over the ranks (3 + 2), their sums reduced once
    assert rows[1]["eval/env/episode_turns"] == 3.0 and "eval/env/pass@1" not in rows[0]


@pytest.mark.subprocess
def test_one_rank_environment_failure_stops_both(tmp_path):
    proc = torchrun_relax("--env", "tests.rollout.agents.scripted:rank_broken", "--num-rollout", "2",
                          "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--device",
                          "cpu", "--output-dir", str(tmp_path / "run"), timeout=120,
                          hang="a rank kept waiting after the other failed")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("relax train: error:")]
    assert any("[rank 1]" in x and "rank 1's environment failed" in x for x in lines), lines


def test_episodes_resume_exactly(tmp_path):
    """Environment seeds are a function of (seed, step, group), so --load continues the
    episodes an uninterrupted run would have played."""
    common = [*RECIPES["grpo"], *ENV]
    full = make_config(*common, "--num-rollout", "3", output_dir=tmp_path / "full")
    _, uninterrupted, _ = fit(full)
    first = make_config(*common, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                        output_dir=tmp_path / "part")
    fit(first)
    resumed = make_config(*common, "--num-rollout", "3", "--load", str(tmp_path / "ckpt"),
                          output_dir=tmp_path / "part")
    _, tail, _ = fit(resumed)
    assert len(tail) == 1
    for key in ("rollout/raw_reward", "rollout/response_length", "train/loss"):
        assert tail[0][key] == pytest.approx(uninterrupted[2][key], rel=1e-6, abs=1e-9), key
