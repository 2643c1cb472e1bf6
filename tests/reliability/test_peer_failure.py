"""A data-parallel rank that dies or hangs makes the others exit with an error in bounded time
(docs/reliability.md). Two real Gloo processes started without torchrun (whose
agent would kill the survivor itself, hiding what the trainer does)."""

import os
import shutil
import signal
import time

import pytest

from tests.reliability.helpers import (
    BASELINE,
    SMALL,
    deterministic,
    finish_all,
    gate_env,
    kill_left,
    read_rows,
    start_ranks,
    wait_for_file,
    write_gate_reward,
)

pytestmark = pytest.mark.subprocess  # every test here starts `relax` processes (conftest.py)


def _ranks(tmp_path, *, timeout_minutes: str):
    args = [*SMALL, "--custom-rm-path", write_gate_reward(tmp_path), "--num-rollout", "4",
            "--output-dir", str(tmp_path / "run"), "--distributed-timeout-minutes",
            timeout_minutes, "--reward-timeout", "100"]
    return start_ranks(args, gate_env(tmp_path, at=2, rank=1))  # rank 1 blocks in step 2


def test_killed_rank_makes_the_survivor_exit_with_an_error(tmp_path):
    rank0, rank1 = _ranks(tmp_path, timeout_minutes="1")
    try:
        wait_for_file(tmp_path / "gate_ready", rank1.proc)
        killed = time.monotonic()
        rank1.proc.send_signal(signal.SIGKILL)
        status = rank0.finish(timeout=90)  # bounded: far below a hang, above the 60 s timeout
        print(f"killed rank detected in {time.monotonic() - killed:.2f} s")
    finally:
        kill_left([rank0, rank1])
    assert status == 1, rank0.lines[-20:]
    (line,) = rank0.errors()
    assert line.startswith("relax train: error: [rank 0] a collective failed: another "), line
    assert "RuntimeError: " in line and "gloo" in line, line  # the backend's own reason


def test_hung_rank_makes_the_survivor_time_out(tmp_path):
    # rank 1 stays alive but never reaches the next collective: only the timeout can help
    rank0, rank1 = _ranks(tmp_path, timeout_minutes="0.1")
    try:
        wait_for_file(tmp_path / "gate_ready", rank1.proc)
        hung = time.monotonic()
        status = rank0.finish(timeout=90)
        print(f"hung rank detected in {time.monotonic() - hung:.2f} s (timeout 6 s)")
    finally:
        kill_left([rank0, rank1])
    assert status == 1, rank0.lines[-20:]
    (line,) = rank0.errors()
    assert "--distributed-timeout-minutes 0.1" in line, line


def test_two_rank_resume_equals_an_uninterrupted_run(tmp_path):
    """Per-rank state (RNG states gathered from both ranks, DDP optimizer state) survives a
    resume: step 3 resumed from the step-2 checkpoint equals step 3 of the full run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # no gate: the reward never waits
    flags = [*SMALL, *BASELINE, "--custom-rm-path", write_gate_reward(tmp_path),
             "--rollout-batch-size", "4", "--num-rollout", "3",
             "--global-batch-size", "4"]  # two AdamW steps per rollout: the second reads the
                                          # restored optimizer state
    save = tmp_path / "save"
    full = start_ranks([*flags, "--save", str(save), "--save-interval", "1", "--output-dir",
                        str(tmp_path / "full")], env)
    assert finish_all(full) == [0, 0], full[0].lines[-20:] + full[1].lines[-20:]
    for stale in (save / "rollout_000003", save / "relax_save.json"):  # resume from step 2
        shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
    resumed = start_ranks([*flags, "--load", str(save), "--output-dir",
                           str(tmp_path / "resumed")], env)
    assert finish_all(resumed) == [0, 0], resumed[0].lines[-20:] + resumed[1].lines[-20:]
    assert any("resuming from" in x and "rollout_000002" in x for x in resumed[0].lines)
    (got,) = read_rows(tmp_path / "resumed")
    want = read_rows(tmp_path / "full")[2]
    assert got["rollout/step"] == want["rollout/step"] == 3
    got, want = deterministic(got), deterministic(want)
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
