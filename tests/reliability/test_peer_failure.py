"""A data-parallel rank that dies or hangs makes the others exit with an error in bounded time
(docs/reliability.md, issue 7 item 4). Two real Gloo processes started without torchrun (whose
agent would kill the survivor itself, hiding what the trainer does)."""

import signal
import time

from tests.distributed_utils import free_port
from tests.reliability.helpers import SMALL, Child, gate_env, write_gate_reward


def _ranks(tmp_path, *, timeout_minutes: str):
    port = str(free_port())
    args = [*SMALL, "--custom-rm-path", write_gate_reward(tmp_path), "--num-rollout", "4",
            "--output-dir", str(tmp_path / "run"), "--distributed-timeout-minutes",
            timeout_minutes, "--reward-timeout", "100"]
    children = []
    for rank in (0, 1):
        env = gate_env(tmp_path, at=2, rank=1)  # rank 1 blocks inside step 2's reward
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        children.append(Child(args, env))
    return children


def test_killed_rank_makes_the_survivor_exit_with_an_error(tmp_path):
    rank0, rank1 = _ranks(tmp_path, timeout_minutes="1")
    try:
        from tests.reliability.helpers import wait_for_file

        wait_for_file(tmp_path / "gate_ready", rank1.proc)
        killed = time.monotonic()
        rank1.proc.send_signal(signal.SIGKILL)
        status = rank0.finish(timeout=90)  # bounded: far below a hang, above the 60 s timeout
        print(f"killed rank detected in {time.monotonic() - killed:.2f} s")
    finally:
        for c in (rank0, rank1):
            if c.proc.poll() is None:
                c.proc.kill()
    assert status == 1, rank0.lines[-20:]
    (line,) = rank0.errors()
    assert line.startswith("relax train: error: [rank 0] a collective failed: another "), line
    assert "RuntimeError: " in line and "gloo" in line, line  # the backend's own reason


def test_hung_rank_makes_the_survivor_time_out(tmp_path):
    # rank 1 stays alive but never reaches the next collective: only the timeout can help
    rank0, rank1 = _ranks(tmp_path, timeout_minutes="0.1")
    try:
        from tests.reliability.helpers import wait_for_file

        wait_for_file(tmp_path / "gate_ready", rank1.proc)
        hung = time.monotonic()
        status = rank0.finish(timeout=90)
        print(f"hung rank detected in {time.monotonic() - hung:.2f} s (timeout 6 s)")
    finally:
        for c in (rank0, rank1):
            if c.proc.poll() is None:
                c.proc.kill()
    assert status == 1, rank0.lines[-20:]
    (line,) = rank0.errors()
    assert "--distributed-timeout-minutes 0.1" in line, line
