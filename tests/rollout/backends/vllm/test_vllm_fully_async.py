"""``--fully-async --rollout-backend vllm`` (relax/trainer/fully_async/rollout_worker.py): the
rollout rank owns a real vLLM server, samples through it and pushes every weight version it
receives from the training rank to it; the training rank starts none.

With ``--max-staleness 0`` every batch is sampled with the weights the training rank holds
when it trains on it, so the trainer's log-probs and the server's agree to fp32 rounding on
every step (``rollout/logprob_abs_diff_max``): with lr 1e-2 a version the server missed would
put a whole optimizer step's movement there, as in tests/rollout/backends/vllm/test_vllm_train.py. Each
sample records the version it was drawn with, and the server is gone when the run ends,
also when the rollout rank is killed. Two runs, each ~40-60 s of a worker: a pool of two servers
that loses one (which is also the lagless run), and a rollout rank killed with its server.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.reliability.helpers import finish_all, kill_left, start_ranks
from tests.rollout.backends.vllm.test_vllm_server import TOL_FP32, VLLM_PYTHON, build_model_dir
from tests.rollout.backends.vllm.test_vllm_train import gone, server_group
from tests.trainer.helpers import RECIPES, read_metrics, write_reward

# torchrun and a vLLM server (conftest.py); the suite's 300 s per test is tighter than the
# runs' own bounded waits (900 s), which a loaded machine needs for two ranks and a server
pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(900)]

if not VLLM_PYTHON.exists():
    pytest.skip("the vLLM environment is absent: `make vllm` builds it (`make test` does)",
                allow_module_level=True)


def test_a_killed_rollout_rank_takes_its_server_with_it(tmp_path):
    """SIGKILL to the rollout rank mid-run (no ``finally`` runs): its server dies with it
    (``PR_SET_PDEATHSIG``), and the training rank ends in one line naming the rollout rank."""
    model_dir = build_model_dir(tmp_path / "model")
    run = tmp_path / "run"
    flags = [*RECIPES["grpo"], "--fully-async", "--max-staleness", "0", "--rollout-backend",
             "vllm", "--hf-checkpoint", str(model_dir), "--custom-rm-path",
             f"{write_reward(tmp_path)}:parity", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6",
             "--num-rollout", "500", "--output-dir", str(run), "--device", "cpu"]
    ranks = start_ranks(flags, {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        ranks[0].wait_for_line("step 2/500", timeout=600)
        pgid = server_group(run / "vllm-server0.log")
        ranks[1].proc.kill()
        assert ranks[0].finish(timeout=120) == 1
    finally:
        kill_left(ranks)
    assert gone(pgid)
    (line,) = ranks[0].errors()
    assert "[rank 0 training]" in line and "rollout rank 1" in line, line


def test_a_pool_of_two_servers_trains_through_the_death_of_one(tmp_path):
    """One rollout rank pools two owned servers (``--vllm-num-servers 2``) and streams every
    version to both; server 1 is SIGKILLed once step 1 is logged. Its requests go to server 0
    and it leaves the pool (one line), so the run trains every step on complete batches (each
    sample counted once, drawn with the newest weights: the mismatch stays at fp32 rounding)
    and ends with exit 0 and no server left.

    The same run is the lagless case of the module docstring (it was a run of its own with one
    server, ~45 s of a worker): every batch sampled by the rollout rank's servers on the
    weights the training rank holds, each version after the start-up one pushed (streamed:
    only v0 on disk), the training rank starting no server."""
    model_dir = build_model_dir(tmp_path / "model")
    run = tmp_path / "run"
    flags = [*RECIPES["grpo"], "--fully-async", "--max-staleness", "0", "--rollout-backend",
             "vllm", "--vllm-num-servers", "2", "--hf-checkpoint", str(model_dir),
             "--custom-rm-path", f"{write_reward(tmp_path)}:parity", "--rollout-batch-size",
             "2", "--n-samples-per-prompt", "2", "--rollout-max-response-len", "6", "--lr",
             "1e-2", "--num-rollout", "4", "--output-dir", str(run), "--device", "cpu"]
    ranks = start_ranks(flags, {**os.environ, "OMP_NUM_THREADS": "1"}, world=2)
    try:
        ranks[0].wait_for_line("step 1/4", timeout=600)
        survivor, killed = (server_group(run / f"vllm-server{k}.log") for k in (0, 1))
        os.killpg(killed, signal.SIGKILL)
        assert finish_all(ranks, timeout=600) == [0, 0], "\n".join(ranks[1].lines[-30:])
    finally:
        kill_left(ranks)
    left = [x for x in ranks[1].lines if "left the pool" in x]
    assert len(left) == 1 and "1 of 2 left" in left[0], ranks[1].lines[-30:]
    rows = read_metrics(run)
    assert [r["rollout/step"] for r in rows] == [1, 2, 3, 4]
    assert rows[0]["train/grad_norm"] > 0  # the weights moved before step 2 sampled
    for row in rows:
        assert row["rollout/logprob_abs_diff_max"] < TOL_FP32, row
        assert row["async/staleness"] == 0 and row["rollout/policy_lag"] == 0, row
    # versions 1 to 3 were pushed (version 0 is what the servers started on)
    for row in rows[1:]:
        assert row["vllm/weight_sync_bytes"] > 0 and row["async/rollout_vllm_sync_time"] > 0
    assert "vllm/weight_sync_bytes" not in rows[0]
    # the rollout rank (world rank 1, rollout rank 0) owned both servers; the training rank
    # started none
    assert sorted(f for f in os.listdir(run) if f.startswith("vllm-server")) == [
        "vllm-server0.log", "vllm-server1.log"]
    # the start-up weights alone on disk: the rollout rank streamed its versions
    # (--vllm-weight-sync collective, the default for owned servers)
    assert os.listdir(run / "vllm-weights-rank1") == ["v0"]
    samples = [json.loads(line) for line in open(run / "samples.jsonl")]
    assert sorted(s["step"] for s in samples) == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    assert {(s["step"], s["policy_version"]) for s in samples} == {
        (1, 0), (2, 1), (3, 2), (4, 3)}
    assert rows[-1]["rollout/server1/in_pool"] == 0 and rows[-1]["rollout/server0/in_pool"] == 1
    assert gone(survivor) and gone(killed)
