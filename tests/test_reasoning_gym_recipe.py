"""The SmolLM2 reasoning-gym recipe: a dry run per arm against a tiny local model directory,
so the flags the script passes are what relax train resolves; the sweep's summary table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import reasoning_gym  # noqa: F401  (the rl extra; make installs it, so it is never skipped)

from relax.config.files import flatten
from relax.config.schema import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "reasoning_gym" / "run-smollm2-reasoning-gym.sh"
SUMMARIZE = ROOT / "examples" / "reasoning_gym" / "summarize.py"
pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return tiny_model_dir


ARMS = {
    "reinforce_plus_plus": dict(normalize_advantages=True, gamma=1.0, kl_coef=0.01,
                                kl_loss_type="k1", use_kl_loss=False),
    "reinforce_plus_plus_baseline": dict(normalize_advantages=True, kl_coef=0.0,
                                         use_kl_loss=True, kl_loss_type="k2", kl_loss_coef=0.01),
    "grpo": dict(normalize_advantages=False, kl_coef=0.0, use_kl_loss=False),
    "ppo": dict(advantage_estimator="ppo", normalize_advantages=True, gamma=1.0, lambd=1.0,
                value_clip=0.2, critic_lr=1e-4, kl_coef=0.0, use_kl_loss=False),
    "opd_only": dict(advantage_estimator="grpo", use_opd=True, opd_only=True, opd_kl_coef=1.0,
                     kl_coef=0.0, use_kl_loss=False),
}


@pytest.mark.parametrize("algo", ARMS)
def test_each_arm_resolves_to_the_documented_flags(algo, model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update(PYTHON=sys.executable, DRY_RUN="1", MODEL_DIR=str(model_dir), ALGO=algo,
               SEED="3", TEACHER_DIR=str(model_dir))
    out = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    cfg = flatten(json.loads(out.stdout), TrainConfig, "--dry-run")  # by flag name
    for key, value in ARMS[algo].items():
        assert cfg[key] == value, key
    assert cfg["advantage_estimator"] == ARMS[algo].get("advantage_estimator", algo)
    assert cfg["seed"] == 3 and cfg["save"] is None
    if algo == "opd_only":
        assert cfg["opd_teacher_load"] == str(model_dir)
    assert cfg["prompt_data"].startswith("reasoning-gym:basic_arithmetic?")
    assert cfg["prompt_data"].endswith("&size=80")  # 20 steps x 4 prompts: one pass
    (name, spec), = cfg["eval_prompt_data"]
    assert name == "heldout" and spec.endswith("&size=200")
    assert cfg["reasoning_gym_answer"] == "last_number" and cfg["eval_temperature"] == 0.0
    assert (cfg["num_rollout"], cfg["rollout_batch_size"], cfg["n_samples_per_prompt"],
            cfg["global_batch_size"], cfg["eval_interval"]) == (20, 4, 8, 32, 20)
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


def test_unknown_arm_is_refused(tmp_path):
    out = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=60, env={**os.environ, "ALGO": "dpo", "DRY_RUN": "1"})
    assert out.returncode == 2 and "choose reinforce_plus_plus" in out.stderr


def test_distillation_needs_a_teacher(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TEACHER_DIR"}
    out = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=60, env={**env, "ALGO": "opd_only", "DRY_RUN": "1"})
    assert out.returncode == 2 and "set TEACHER_DIR" in out.stderr


def test_save_dir_adds_save(model_dir, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update(PYTHON=sys.executable, DRY_RUN="1", MODEL_DIR=str(model_dir), ALGO="grpo",
               SAVE_DIR=str(tmp_path / "save"))
    out = subprocess.run(["bash", str(RECIPE)], capture_output=True, text=True, cwd=tmp_path,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert flatten(json.loads(out.stdout), TrainConfig, "--dry-run")["save"] == str(
        tmp_path / "save")


def test_summary_table(tmp_path):
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "eval_metrics.json").write_text(json.dumps(
        {"eval/heldout/pass@1": 0.3, "eval/heldout/mean_reward": 0.3}))
    for name, final in (("grpo-seed1", 0.45), ("grpo-seed2", 0.35), ("x-seed1", None)):
        rows = [{"rollout/step": s, "rollout/raw_reward": 0.1 * s, "perf/step_time": 30.0,
                 "rollout/response_length": 40.0} for s in range(1, 7)]
        if final is not None:
            rows[-1].update({"eval/heldout/pass@1": final, "eval/heldout/mean_reward": final,
                             "perf/eval_time": 60.0})
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(SUMMARIZE), str(tmp_path)], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "| grpo | 1 | 6 | 0.450 | +15.0 pt |" in out.stdout
    assert "| grpo | 2 | 0.400 | +10.0 pt | 0.350-0.450 |" in out.stdout
    assert "x |" not in out.stdout  # an unfinished run is left out
