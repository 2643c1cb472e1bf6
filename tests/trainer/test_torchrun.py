"""``torchrun --nproc_per_node 2 -m relax train``: two real Gloo processes, bounded wait."""

import json

import pytest

from tests.distributed_utils import torchrun_relax
from tests.trainer.helpers import RECIPES, read_metrics, write_reward

pytestmark = pytest.mark.subprocess  # every test here starts torchrun (conftest.py)


@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_process_gloo_run(tmp_path, fsdp):
    """The launch as a user's shell makes it (fresh processes: ``python -m
    torch.distributed.run``, each rank ``python -u -m relax``). The DDP run is also launched
    the way the other tests launch theirs (tests/preloaded.py: torchrun's agent forked from
    a preloaded process, ranks forked by it), and the two runs agree in every metric but
    time and memory: the tests' launch trains as a user's does."""
    reward = write_reward(tmp_path)
    out, save = tmp_path / "run", tmp_path / "save"
    flags = [*RECIPES["reinforce_plus_plus_baseline"], "--num-rollout", "2",
             "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
             "--rollout-max-response-len", "4", "--micro-batch-size", "4", "--custom-rm-path",
             f"{reward}:parity", "--device", "cpu", *(["--fsdp"] if fsdp else [])]
    proc = torchrun_relax(*flags, "--output-dir", str(out), "--save", str(save), fresh=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_metrics(out)
    if not fsdp:
        forked = torchrun_relax(*flags, "--output-dir", str(tmp_path / "forked"))
        assert forked.returncode == 0, forked.stderr[-3000:]
        again = read_metrics(tmp_path / "forked")
        assert len(again) == len(rows) == 2
        for a, b in zip(again, rows, strict=True):
            keys = [k for k in b if not k.startswith("perf/")]
            assert keys and {k: a[k] for k in keys} == {k: b[k] for k in keys}
    # written by rank 0 only: one line per rollout step, not one per rank
    assert [r["rollout/step"] for r in rows] == [1, 2]
    for r in rows:
        assert abs(r["rollout/advantage_normalized_mean"]) < 1e-5
        assert r["rollout/advantage_normalized_std"] == pytest.approx(1.0, abs=1e-4)
        # 16 prompts' worth of samples over both ranks: 4 prompts x 4 samples, <= 4 tokens each
        assert 16 <= r["rollout/valid_tokens"] <= 64 and "train/kl_loss" in r
    with open(out / "config.json") as f:
        assert json.load(f)["world_size"] == 2
    with open(save / "relax_save.json") as f:
        assert json.load(f)["rollout_step"] == 2
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(save).config.model_type == "qwen3"


def test_reward_failure_on_one_rank_stops_both(tmp_path):
    reward = write_reward(tmp_path, "import os\ndef f(p, r, l):\n"
                          "    if os.environ['RANK'] == '1':\n"
                          "        raise RuntimeError('reward service down')\n"
                          "    return [0.0] * len(p)\n")
    proc = torchrun_relax("--num-rollout", "2", "--rollout-batch-size", "2",
                          "--n-samples-per-prompt", "2", "--custom-rm-path", f"{reward}:f",
                          "--device", "cpu", "--output-dir", str(tmp_path / "run"), timeout=120,
                          hang="a rank kept waiting after the other failed")
    assert proc.returncode != 0
    lines = [x for x in proc.stderr.splitlines() if x.startswith("relax train: error:")]
    assert any("[rank 1] reward function" in x and "reward service down" in x for x in lines)
    assert any("[rank 0] another data-parallel rank failed" in x for x in lines)


def _alive(pid: int) -> bool:
    """A process that has not ended (a zombie has: it waits only for its reaper)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ranks_stop_when_torchrun_is_killed(tmp_path):
    """SIGKILL cannot be passed on to torchrun's workers: each rank watches its launcher and
    stops by itself instead of waiting in a collective for --distributed-timeout-minutes."""
    import os
    import signal
    import subprocess
    import time

    from tests.distributed_utils import TORCHRUN

    reward = write_reward(tmp_path, "import os, time\ndef f(p, r, l):\n"
                          f"    open({str(tmp_path)!r} + f'/pid{{os.environ[\"RANK\"]}}', 'w')"
                          ".write(str(os.getpid()))\n"
                          "    time.sleep(600)\n")
    with open(tmp_path / "stderr", "w") as err:
        launcher = subprocess.Popen(
            [*TORCHRUN, "--nproc_per_node", "2", "-m", "relax", "train", "--num-rollout", "1",
             "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--custom-rm-path", f"{reward}:f", "--device", "cpu",
             "--output-dir", str(tmp_path / "run")],
            stdout=subprocess.DEVNULL, stderr=err, env={**os.environ, "OMP_NUM_THREADS": "1"})
    pids, deadline = [], time.monotonic() + 180
    try:
        while len(pids) < 2 and time.monotonic() < deadline and launcher.poll() is None:
            pids = [int(p.read_text()) for p in tmp_path.glob("pid*") if p.read_text()]
            time.sleep(0.2)
        assert len(pids) == 2, (tmp_path / "stderr").read_text()[-3000:]
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
        stop = time.monotonic() + 60
        while any(map(_alive, pids)) and time.monotonic() < stop:
            time.sleep(0.2)
        survivors = [p for p in pids if _alive(p)]
    finally:
        launcher.kill()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert survivors == [], "ranks outlived their killed launcher"
    said = (tmp_path / "stderr").read_text()
    assert said.count("its launcher (pid") == 2 and "this rank stops too" in said, said[-2000:]
