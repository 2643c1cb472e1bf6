"""The Qwen3-0.6B recipe scripts: a dry run per arm against a tiny local model directory and
a GSM8K-style data file made here, so the flags of reinforce_plus_plus.md §8 and Recipes that
the script passes are exactly what relax train resolves; the 3 x 3 sweep; shellcheck when it is installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from relax.config import TrainConfig
from relax.config.files import flatten

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "examples" / "algorithms" / "run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh"
SWEEP = ROOT / "examples" / "algorithms" / "run-qwen3-0.6B-reinforce-plus-plus-3x3.sh"
TIMEOUT = 120
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny Hugging Face model directory (the built-in model, saved) and GSM8K-style data."""
    from relax.tiny_model import build_tiny_model, build_tokenizer

    root = tmp_path_factory.mktemp("recipe")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    for split in ("train", "test"):
        (root / f"{split}.jsonl").write_text(
            json.dumps({"question": "What is 2+3?", "answer": "5"}) + "\n")
    return root


def run(script, setup, **env):
    full = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    full.update(PYTHON=sys.executable, DRY_RUN="1", MODEL_DIR=str(setup / "model"),
                DATA=str(setup / "train.jsonl"), EVAL_DATA=str(setup / "test.jsonl"))
    full.update(env)
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=setup,
                          timeout=TIMEOUT, env=full)


ARMS = {
    "reinforce_plus_plus": dict(normalize_advantages=True, gamma=1.0, kl_coef=0.01,
                                kl_loss_type="k1", use_kl_loss=False, kl_loss_coef=0.0),
    "reinforce_plus_plus_baseline": dict(normalize_advantages=True, kl_coef=0.0,
                                         use_kl_loss=True, kl_loss_type="k2",
                                         kl_loss_coef=0.01),
    "grpo": dict(normalize_advantages=False, kl_coef=0.0, use_kl_loss=False,
                 disable_grpo_std_normalization=False),
}
BUDGET = dict(num_rollout=50, rollout_batch_size=4, n_samples_per_prompt=8,
              global_batch_size=32, num_steps_per_rollout=1, rollout_max_response_len=1024,
              lr=1e-6, eps_clip=0.2, eps_clip_high=0.2, seed=42, builtin_preset_applied=False,
              apply_chat_template=True, rm_type="math", input_key="question",
              label_key="answer")


@pytest.mark.parametrize("algo", sorted(ARMS))
@pytest.mark.subprocess
def test_each_arm_dry_runs_with_its_spec_flags_at_one_budget(setup, algo):
    proc = run(RECIPE, setup, ALGO=algo)
    assert proc.returncode == 0, proc.stderr
    cfg = flatten(json.loads(proc.stdout), TrainConfig, "--dry-run")  # by flag name
    assert cfg["advantage_estimator"] == algo
    assert {k: cfg[k] for k in ARMS[algo]} == ARMS[algo]
    assert {k: cfg[k] for k in BUDGET} == BUDGET
    assert cfg["hf_checkpoint"] == str(setup / "model")
    assert cfg["prompt_data"] == str(setup / "train.jsonl")
    assert cfg["eval_prompt_data"] == [["gsm8k", str(setup / "test.jsonl")]]
    assert cfg["output_dir"] == f"runs/qwen3-0.6B-gsm8k/{algo}-seed42"
    # the math reward reads the last \boxed{} answer; the prompt asks for it verbatim
    assert cfg["system_prompt"].endswith("final answer within \\boxed{}.")


@pytest.mark.subprocess
def test_environment_overrides_and_errors(setup):
    proc = run(RECIPE, setup, ALGO="grpo", SEED="2026", NUM_ROLLOUT="3", LR="2e-6",
               ROLLOUT_BATCH_SIZE="2", N_SAMPLES_PER_PROMPT="4", GLOBAL_BATCH_SIZE="4",
               MICRO_BATCH_SIZE="2", MAX_RESPONSE_LEN="64", EVAL_DATA="", OUTPUT_DIR="o")
    assert proc.returncode == 0, proc.stderr
    cfg = flatten(json.loads(proc.stdout), TrainConfig, "--dry-run")  # by flag name
    assert (cfg["seed"], cfg["num_rollout"], cfg["lr"], cfg["num_steps_per_rollout"],
            cfg["micro_batch_size"], cfg["rollout_max_response_len"], cfg["eval_interval"],
            cfg["output_dir"]) == (2026, 3, 2e-6, 2, 2, 64, None, "o")
    proc = run(RECIPE, setup, ALGO="ppo")
    assert proc.returncode == 2 and "ALGO=ppo" in proc.stderr
    # relax train's own validation still applies to what the environment asks for
    proc = run(RECIPE, setup, ALGO="reinforce_plus_plus_baseline", N_SAMPLES_PER_PROMPT="1",
               GLOBAL_BATCH_SIZE="4")
    assert proc.returncode == 2 and "--n-samples-per-prompt 1" in proc.stderr


@pytest.mark.subprocess
def test_sweep_runs_three_arms_times_three_seeds(setup):
    proc = run(SWEEP, setup, ROOT="sweep")
    assert proc.returncode == 0, proc.stderr
    heads = [line for line in proc.stdout.splitlines() if line.startswith("== ")]
    assert heads == [f"== {a} seed {s} -> sweep/{a}-seed{s}"
                     for a in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo")
                     for s in (42, 1234, 2026)]
    assert proc.stdout.count('"advantage_estimator"') == 9  # one configuration per run


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed")
def test_shellcheck_clean():
    proc = subprocess.run(["shellcheck", str(RECIPE), str(SWEEP)], capture_output=True,
                          text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout
