"""``relax train --rollout-backend vllm`` with a real owned vLLM server: two steps end to end
(the server samples with the trainer's weights after each update, streamed by default or
from disk, so the mismatch stays at fp32 rounding), a server killed mid-run (one line naming it and its log, exit 1, no process
left) and a SIGTERM (exit 143, the server gone with the run)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from relax.rollout.backends.vllm.vllm_server import group_alive
from tests.distributed_utils import torchrun_relax
from tests.reliability.helpers import (
    finish,
    gate_env,
    start_train,
    wait_for_file,
    write_gate_reward,
)
from tests.rollout.backends.vllm.test_vllm_server import TOL_FP32, VLLM_PYTHON, build_model_dir
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward

pytestmark = pytest.mark.subprocess

if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is absent: `make vllm` builds it (`make test` does)",
                allow_module_level=True)

SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "6", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_model_dir(tmp_path_factory.mktemp("vllm-model"))


def server_group(log: Path) -> int:
    """The owned server's process group: the API server's pid, which its log names."""
    found = re.search(r"\(APIServer pid=(\d+)\)", log.read_text(errors="replace"))
    assert found, f"no server pid in {log}"
    return int(found.group(1))


def gone(pgid: int, timeout: float = 30.0) -> bool:
    """No process of the group is left (killed ones are reaped by init: a bounded wait)."""
    deadline = time.monotonic() + timeout
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_lora_loads_the_adapter_by_name(tmp_path, model_dir):
    """--lora-rank: the server serves --hf-checkpoint with --enable-lora and loads the
    adapter after each update; step 2 samples with step 1's adapter (a missed load would
    put the update's movement into the mismatch), and a sync moves the adapter only."""
    cfg = make_config("--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
                      "--custom-rm-path", f"{write_reward(tmp_path)}:parity", *SMALL,
                      "--lora-rank", "4", "--lora-alpha", "8", output_dir=tmp_path / "run")
    _, _, moved = fit(cfg)
    assert moved > 1e-4, "the update did not change the adapter"
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
        assert 0 < row["vllm/weight_sync_bytes"] < 1 << 20, row  # the adapter, not the model
    assert os.listdir(tmp_path / "run" / "vllm-weights-rank0") == ["v2"]
    log = (tmp_path / "run" / "vllm-server0.log").read_text()
    assert "'enable_lora': True" in log and "adapter: name 'relax-lora-v2'" in log
    assert gone(server_group(tmp_path / "run" / "vllm-server0.log"))


def test_two_fsdp_ranks_each_own_a_server_and_stream_to_it(tmp_path, model_dir):
    """--fsdp on two Gloo ranks, a server per rank (server k started by rank k, its log
    vllm-server<k>.log), both ranks pooling both servers, the weights streamed (the default
    --vllm-weight-sync collective): every rank gathers each bucket and sends it to the
    server it started, once per version over one transfer group; both servers answer
    completions and follow the update (the mismatch, reduced over the ranks, stays at
    rounding), only the start-up weights were written, both are gone at the end."""
    run = tmp_path / "run"
    done = torchrun_relax("--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
                          "--custom-rm-path", f"{write_reward(tmp_path)}:parity", *SMALL,
                          "--fsdp", "--weight-sync-bucket-mb", "0.05", "--num-rollout", "2",
                          "--output-dir", str(run), "--device", "cpu",
                          timeout=900, hang="a two-rank FSDP vLLM run did not finish")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["rollout/step"] for r in rows] == [1, 2]
    assert rows[0]["train/grad_norm"] > 0  # the weights moved before step 2 sampled
    assert all(r["rollout/logprob_abs_diff_max"] < TOL_FP32 for r in rows), rows
    for row in rows:  # one pool: every rank records both servers under the same names
        assert sum(row[f"rollout/server{k}/requests"] for k in (0, 1)) == 4, row  # 2 x 2
        assert all(row[f"rollout/server{k}/in_pool"] == 1.0 for k in (0, 1)), row
        # the step's update, pushed before its row is written
        assert all(row[f"rollout/server{k}/weight_version"] == row["rollout/step"]
                   for k in (0, 1)), row
    assert os.listdir(run / "vllm-weights") == ["v0"]  # under FSDP2 one folder, rank 0's
    for k in (0, 1):
        log = (run / f"vllm-server{k}.log").read_text(errors="replace")
        assert '"POST /v1/completions HTTP/1.1" 200' in log, log[-2000:]
        # one group set up, one update per version (v1, v2) by the rank that started it
        assert log.count('"POST /init_weight_transfer_engine HTTP/1.1" 200') == 1, log[-2000:]
        assert log.count('"POST /start_weight_update HTTP/1.1" 200') == 2, log[-2000:]
        assert log.count('"POST /update_weights HTTP/1.1" 200') > 2  # several buckets each
        assert '"POST /collective_rpc' not in log  # nothing reloaded from disk
        assert gone(server_group(run / f"vllm-server{k}.log"))


def test_fsdp_ranks_write_one_folder_from_their_shards(tmp_path, model_dir):
    """--fsdp on two Gloo ranks with --vllm-num-servers 1 and --vllm-weight-sync disk: the
    weights are gathered bucket by bucket and written once, by rank 0, into one folder that
    the one server (rank 0's) reloads; rank 1 starts none and samples from it too (the pool
    of both ranks), so the mismatch, reduced over the ranks, stays at rounding; the server
    is gone at the end."""
    run = tmp_path / "run"
    done = torchrun_relax("--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
                          "--custom-rm-path", f"{write_reward(tmp_path)}:parity", *SMALL,
                          "--fsdp", "--weight-sync-bucket-mb", "0.05", "--num-rollout", "2",
                          "--vllm-num-servers", "1", "--vllm-weight-sync", "disk",
                          "--output-dir", str(run), "--device", "cpu",
                          timeout=900, hang="a two-rank FSDP vLLM run did not finish")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(run)
    assert [r["rollout/step"] for r in rows] == [1, 2]
    assert rows[0]["train/grad_norm"] > 0  # the weights moved before step 2 sampled
    assert all(r["rollout/logprob_abs_diff_max"] < TOL_FP32 for r in rows), rows
    assert os.listdir(run / "vllm-weights") == ["v2"]
    assert not (run / "vllm-weights-rank0").exists()
    written = os.listdir(run / "vllm-weights" / "v2")
    assert "model.safetensors.index.json" in written
    assert sum(f.endswith(".safetensors") for f in written) > 2  # one file per bucket
    assert not (run / "vllm-server1.log").exists()  # rank 1 started none
    assert rows[-1]["rollout/server0/requests"] == 4  # both ranks' samples (2 x 2)
    assert gone(server_group(run / "vllm-server0.log"))


def test_two_steps_end_to_end_then_a_resume_pushes_its_weights_first(tmp_path, model_dir):
    """Two steps end to end: the server samples with the trainer's weights after each update,
    so the mismatch stays at fp32 rounding, and it is gone with the run. Then the run is
    resumed from its checkpoint: the server starts on the loaded model's weights, which the
    checkpoint moved, so the resumed run pushes them before its first step and that step's
    mismatch stays at rounding too (without the push it would carry two steps of lr 1e-2).
    Inside the resumed run's second step's reward its server is killed: the run then fails
    at the weight sync, naming the server and its log, with no server process left. One
    test, so that two owned server starts serve all three (each costs ~30 s of a worker)."""
    reward = write_gate_reward(tmp_path)  # the parity reward until its gate is armed
    common = ["--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
              "--custom-rm-path", reward, *SMALL]
    first = tmp_path / "first"
    _, _, moved = fit(make_config(*common, "--save", str(tmp_path / "ckpt"), "--save-interval",
                                  "1", output_dir=first))
    assert moved > 1e-4, "the update did not change the parameters"
    rows = read_metrics(first)
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for row in rows:
        # step 2 samples after an update: a missed sync would put the step's movement here
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
        assert row["rollout/policy_lag"] == 0 and row["vllm/weight_sync_bytes"] > 0
        assert row["perf/weight_sync_time"] > 0
    samples = [json.loads(line) for line in open(first / "samples.jsonl")]
    assert {(s["step"], s["policy_version"]) for s in samples} == {(1, 0), (2, 1)}
    # streamed (the default for an owned server): the start-up weights alone were written
    assert os.listdir(first / "vllm-weights-rank0") == ["v0"]
    assert gone(server_group(first / "vllm-server0.log"))

    # resumed at step 3; the gate holds step 4's reward (its 2nd call) while the server dies
    resumed = tmp_path / "resumed"
    proc = start_train([*common, "--load", str(tmp_path / "ckpt"), "--num-rollout", "20",
                        "--output-dir", str(resumed), "--device", "cpu"],
                       gate_env(tmp_path, at=2, go=True))
    try:
        wait_for_file(tmp_path / "gate_ready", proc, timeout=600)
        pgid = server_group(resumed / "vllm-server0.log")
        os.kill(pgid, signal.SIGKILL)
        (tmp_path / "gate_go").touch()
        status, err = finish(proc, timeout=300)
    finally:
        proc.kill()
    rows = read_metrics(resumed)
    assert [r["rollout/step"] for r in rows] == [3], rows  # step 4 never finished
    assert rows[0]["rollout/policy_lag"] == 0
    assert rows[0]["rollout/logprob_abs_diff_max"] < TOL_FP32, rows[0]
    samples = [json.loads(line) for line in open(resumed / "samples.jsonl")]
    assert {s["policy_version"] for s in samples if s["step"] == 3} == {2}
    line = err.strip().splitlines()[-1]
    assert status == 1, err[-2000:]
    assert line.startswith("relax train: error: vLLM server http://127.0.0.1:"), line
    assert str(resumed / "vllm-server0.log") in line and "exited with status -9" in line, line
    assert gone(pgid)


def test_a_sigterm_ends_the_run_with_its_server(tmp_path, model_dir):
    """Inside step 2's reward the trainer gets SIGTERM: it stops after the step (exit 143)
    and no server process is left (a killed server: the resumed run of
    test_two_steps_end_to_end_then_a_resume_pushes_its_weights_first).

    The run also samples with --rollout-bf16 (relax/precision.py ``use_rollout_bf16``), so
    that one server start checks it too: the owned server runs at dtype bfloat16 while the
    trainer stays fp32, and the sampler/trainer gap is then a bf16 model's, far above the fp32
    server's rounding (TOL_FP32)."""
    run = tmp_path / "run"
    proc = start_train(["--rollout-backend", "vllm", "--hf-checkpoint", str(model_dir),
                        "--custom-rm-path", write_gate_reward(tmp_path), *SMALL,
                        "--rollout-bf16", "--num-rollout", "20", "--output-dir", str(run),
                        "--device", "cpu"],
                       gate_env(tmp_path, at=2, go=True))
    try:
        wait_for_file(tmp_path / "gate_ready", proc, timeout=600)
        pgid = server_group(run / "vllm-server0.log")
        proc.send_signal(signal.SIGTERM)
        (tmp_path / "gate_go").touch()
        status, err = finish(proc, timeout=300)
    finally:
        proc.kill()
    assert status == 143, err[-2000:]
    log = (run / "vllm-server0.log").read_text(errors="replace")
    assert "'dtype': 'bfloat16'" in log  # the server's own record of its arguments
    config = json.loads((run / "config.json").read_text())["system"]
    assert config["bf16"] is None and config["device"] == "cpu"  # the trainer: fp32 on a CPU
    rows = read_metrics(run)
    assert rows and all(r["rollout/logprob_abs_diff_max"] > 100 * TOL_FP32 for r in rows), rows
    assert gone(pgid)
