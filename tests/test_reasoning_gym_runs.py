"""``relax train`` and ``relax eval`` on reasoning-gym sources, end to end with the tiny model
saved as a Hugging Face directory: the dry run validates without generating, bad sources exit
2 with one line naming the flag, training scores with the dataset's verifier and writes
samples.jsonl, evaluation reports pass@1 per set (real subprocesses; small sizes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import reasoning_gym  # noqa: F401  (the rl extra; make installs it, so it is never skipped)

pytestmark = pytest.mark.subprocess  # every test here starts `relax` processes (conftest.py)

TIMEOUT = 240
ARITH = ("reasoning-gym:basic_arithmetic?size={n}&min_terms=2&max_terms=2&min_digits=1"
         "&max_digits=1&operators=+&allow_parentheses=false&allow_negation=false")


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return str(tiny_model_dir)


def relax(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "relax", *args], capture_output=True,
                          text=True, timeout=TIMEOUT, env=env)


def test_dry_run_validates_the_source_without_generating(model_dir):
    # the largest size a run may ask for (items are generated eagerly when it starts)
    out = relax("train", "--hf-checkpoint", model_dir, "--prompt-data", ARITH.format(n=10**5),
                "--num-rollout", "2", "--reasoning-gym-answer", "last_number", "--dry-run")
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert (cfg["rollout"]["data"]["prompt_data"].startswith("reasoning-gym:")
            and cfg["run"]["log_samples"] == 4)
    # a billion items would never finish generating: refused at validation, naming the bound
    out = relax("train", "--hf-checkpoint", model_dir, "--prompt-data", ARITH.format(n=10**9),
                "--num-rollout", "2", "--reasoning-gym-answer", "last_number", "--dry-run")
    assert out.returncode == 2 and "size must be an integer in [1, 100000]" in out.stderr


@pytest.mark.parametrize("args, head", [
    (["--prompt-data", "reasoning-gym:no_such_set"], "--prompt-data reasoning-gym:no_such_set: "),
    (["--prompt-data", "reasoning-gym:chain_sum?size=abc"], "--prompt-data reasoning-gym:chain_sum?size=abc: "),
    (["--prompt-data", "reasoning-gym:chain_sum?speed=3"], "--prompt-data reasoning-gym:chain_sum?speed=3: "),
    (["--prompt-data", "reasoning-gym:chain_sum", "--eval-interval", "1", "--eval-prompt-data",
      "x", "reasoning-gym:chain_sum?min_digits=-1"], "--eval-prompt-data x reasoning-gym:chain_sum?min_digits=-1: "),
    (["--prompt-data", "reasoning-gym:chain_sum", "--input-key", "q"], "--input-key q: "),
    (["--reasoning-gym-answer", "boxed"], "--reasoning-gym-answer boxed: "),
    (["--prompt-data", "reasoning-gym:chain_sum", "--rm-type", "math", "--reasoning-gym-answer",
      "boxed"], "--reasoning-gym-answer boxed: "),
    (["--log-samples", "-1"], "--log-samples -1: "),
])
def test_bad_input_is_one_line_and_exit_2(model_dir, args, head):
    out = relax("train", "--hf-checkpoint", model_dir, "--num-rollout", "2", *args, "--dry-run")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith(f"relax train: error: {head}")


def test_train_on_a_reasoning_gym_source_with_samples_and_evaluation(model_dir, tmp_path):
    run = tmp_path / "run"
    out = relax("train", "--hf-checkpoint", model_dir, "--prompt-data", ARITH.format(n=400),
                "--reasoning-gym-answer", "last_number", "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "2", "--num-rollout", "2",
                "--rollout-max-response-len", "4", "--lr", "1e-3", "--log-samples", "3",
                "--eval-interval", "2", "--eval-prompt-data", "arith", ARITH.format(n=8),
                "--eval-temperature", "0", "--output-dir", str(run))
    assert out.returncode == 0, out.stderr
    # 400 training draws of ~100 one-digit sums: the eval questions repeat, and the run says so
    assert "prompts of evaluation set 'arith' also appear in --prompt-data" in out.stderr
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 1, 1, 2, 2, 2]
    for r in rows:
        assert set(r) == {"step", "prompt", "response", "reward", "label", "response_length",
                          "truncated"}
        assert r["prompt"].endswith(r["label"]["question"])  # no system message: last_number
        assert r["reward"] in (0.0, 1.0)  # the verifier's exact-match score on sums
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "eval/arith/pass@1" in metrics[-1] and "eval/arith/pass@1" not in metrics[0]


def test_log_samples_zero_writes_no_file(model_dir, tmp_path):
    run = tmp_path / "run"
    out = relax("train", "--hf-checkpoint", model_dir, "--prompt-data", ARITH.format(n=20),
                "--reasoning-gym-answer", "last_number", "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "2", "--num-rollout", "1",
                "--rollout-max-response-len", "2", "--log-samples", "0",
                "--output-dir", str(run))
    assert out.returncode == 0, out.stderr
    assert not (run / "samples.jsonl").exists() and (run / "metrics.jsonl").exists()


def test_eval_command_scores_a_reasoning_gym_set(model_dir, tmp_path):
    out = relax("eval", model_dir, "--eval-prompt-data", "sums", ARITH.format(n=6),
                "--reasoning-gym-answer", "last_number", "--eval-temperature", "0",
                "--eval-max-response-len", "3", "--output-dir", str(tmp_path))
    assert out.returncode == 0, out.stderr
    metrics = json.loads(out.stdout)
    assert 0.0 <= metrics["eval/sums/pass@1"] <= 1.0 and "eval/sums/mean_reward" in metrics
    bad = relax("eval", model_dir, "--eval-prompt-data", "reasoning-gym:nope")
    assert bad.returncode == 2
    assert bad.stderr.startswith("relax eval: error: --eval-prompt-data nope reasoning-gym:nope")
