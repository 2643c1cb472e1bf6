"""benchmarks/gpu_check.{sh,py}: the one-call GPU check, its logic proven on the CPU.

The check itself needs a GPU that CI never has; its Python part has a tiny CPU mode that runs
every phase (model built in code, ``relax train`` in a child process, Relax's decode against
transformers' static-cache ``generate``), so a broken flag, metric name or API call shows here
first. The CUDA-only figures (peak GPU memory) must come back as absent, not fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.subprocess  # the check runs `relax train` and scripts as processes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(
    p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}


def test_tiny_cpu_mode_runs_every_phase(tmp_path):
    workdir = tmp_path / "check"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"), "--size", "tiny",
         "--device", "cpu", "--workdir", str(workdir), "--train-timeout", "120"],
        capture_output=True, text=True, env={**ENV, "OMP_NUM_THREADS": "1"}, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "all phases ran" in proc.stdout
    summary = json.loads((workdir / "summary.json").read_text())
    train = summary["train"]
    assert train["steps"] == 2 and train["step_time_s"] > 0
    # the check trains with activation recompute on, and says so
    assert train["recompute"] == "full"
    config = json.loads((workdir / "run" / "config.json").read_text())
    assert config["recompute"]["recompute_granularity"] == "full"
    assert "recompute full" in proc.stdout
    assert train["phases_s"]["generate"] > 0 and train["phases_s"]["update"] > 0
    # REINFORCE++ with --kl-coef has a reference pass, so every ratio is reported
    for key in ("mfu", "update_mfu", "log_prob_mfu", "generate_bandwidth_fraction"):
        assert train[key] is not None and train[key] > 0, key
    decode = summary["decode"]
    for side in ("relax", "transformers"):
        assert decode[side]["tokens"] > 0 and decode[side]["seconds"] > 0
        assert decode[side]["peak_memory_gb"] is None  # a GPU figure; none on the CPU
    assert decode["ratio_transformers_over_relax"] > 0
    packing = summary["packing"]  # the packed passes equal the padded ones on the device
    assert 0 <= packing["logprob_max_abs_diff"] < 1e-3 and packing["grad_max_rel_diff"] < 1e-2


def test_a_training_run_out_of_time_fails_the_check_with_a_short_message(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"), "--size", "tiny",
         "--device", "cpu", "--workdir", str(tmp_path / "check"), "--train-timeout", "0.5",
         "--skip-decode"], capture_output=True, text=True, env=ENV, timeout=120)
    assert proc.returncode == 1
    assert "train FAILED: timed out after 0 s" in proc.stdout  # not the whole command line
    assert "FAILED: train" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without a GPU")
def test_shell_script_stops_with_a_message_without_cuda():
    proc = subprocess.run(["bash", os.path.join(REPO, "benchmarks", "gpu_check.sh")],
                          capture_output=True, text=True, env={**ENV, "PY": sys.executable},
                          timeout=120)
    assert proc.returncode == 2
    assert "no CUDA device visible" in proc.stderr
    assert "(a) algorithm tests" not in proc.stdout  # nothing started
