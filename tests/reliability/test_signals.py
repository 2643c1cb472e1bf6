"""SIGTERM / SIGINT end the current rollout step, checkpoint with --save, exit non-zero with a
message (docs/reliability.md)."""

import signal
import time

import pytest

from relax.errors import Interrupted
from relax.trainer.distributed import init_distributed
from relax.trainer.loop import Trainer
from relax.trainer.signals import StopRequest
from relax.trainer.state import checkpoint
from tests.reliability.helpers import (
    SMALL,
    Child,
    gate_env,
    read_rows,
    wait_for_file,
    write_gate_reward,
)
from tests.trainer.helpers import make_config, write_reward


@pytest.mark.subprocess
def test_sigterm_mid_step_finishes_the_step_saves_and_exits_143(tmp_path):
    save, out = tmp_path / "save", tmp_path / "run"
    child = Child([*SMALL, "--custom-rm-path", write_gate_reward(tmp_path), "--num-rollout",
                   "6", "--save", str(save), "--output-dir", str(out)],
                  gate_env(tmp_path, at=2, go=True))
    wait_for_file(tmp_path / "gate_ready", child.proc)  # inside step 2's reward
    sent = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    child.wait_for_line("received SIGTERM: finishing the current rollout step")
    (tmp_path / "gate_go").touch()  # let step 2 finish
    assert child.finish(timeout=60) == 128 + signal.SIGTERM
    print(f"SIGTERM to exit: {time.monotonic() - sent:.2f} s")
    (line,) = child.errors()
    assert "stopped by SIGTERM after rollout step 2 of 6" in line
    assert f"--load {save}" in line
    # step 2 completed (logged, checkpointed); step 3 never started
    assert [r["rollout/step"] for r in read_rows(out)] == [1, 2]
    assert checkpoint.latest_checkpoint(str(save)) == (str(save / "rollout_000002"), 2)


def fit_until_interrupted(cfg, match: str) -> Interrupted:
    """Train in this process with the signal handlers installed; return the Interrupted."""
    stop = StopRequest()
    stop.install()
    try:
        trainer = Trainer(cfg, init_distributed("cpu"), console=False, stop=stop)
        with pytest.raises(Interrupted, match=match) as e:
            trainer.fit()
        trainer.close()
    finally:
        stop.restore()
    return e.value


@pytest.mark.parametrize("saving", [[], ["--save-interval", "1", "--async-save"]],
                         ids=["final-only", "async-interval"])
def test_sigint_in_process_stops_after_the_step_with_a_checkpoint(tmp_path, saving,
                                                                  python_sigint):
    # with --async-save the interval save of step 1 is still being written when the stop
    # asks for the checkpoint of step 1: it is waited for, published, and named
    # the reward interrupts its own process during step 1, like Ctrl-C at the terminal
    reward = write_reward(tmp_path, "import os, signal\ncalls = []\n"
                          "def f(p, r, l):\n    calls.append(1)\n"
                          "    if len(calls) == 1:\n        os.kill(os.getpid(), signal.SIGINT)\n"
                          "    return [0.5] * len(p)\n", "sigint_reward.py")
    cfg = make_config(*SMALL, "--custom-rm-path", f"{reward}:f", "--num-rollout", "3",
                      "--save", str(tmp_path / "save"), *saving, tiny=False,
                      output_dir=tmp_path / "run")
    error = fit_until_interrupted(cfg, "stopped by SIGINT after rollout step 1 of 3; "
                                  "checkpoint .*rollout_000001")
    assert error.exit_code == 130
    assert checkpoint.latest_checkpoint(str(tmp_path / "save"))[1] == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handlers restored


def test_second_signal_stops_at_once_even_while_a_reward_runs(tmp_path):
    # the reward (on its worker thread) sends SIGINT, waits until the handler has taken it,
    # then sends another: the second must interrupt the step, not become a reward error
    reward = write_reward(tmp_path, "import os, signal, time\n"
                          "def f(p, r, l):\n"
                          "    stop = signal.getsignal(signal.SIGINT).__self__\n"
                          "    os.kill(os.getpid(), signal.SIGINT)\n"
                          "    deadline = time.monotonic() + 30\n"
                          "    while stop.signum is None and time.monotonic() < deadline:\n"
                          "        time.sleep(0.001)\n"
                          "    os.kill(os.getpid(), signal.SIGINT)\n"
                          "    time.sleep(0.2)  # the handler raises in the main thread meanwhile\n"
                          "    return [0.5] * len(p)\n", "twice.py")
    cfg = make_config(*SMALL, "--custom-rm-path", f"{reward}:f", "--num-rollout", "3",
                      "--save", str(tmp_path / "save"), tiny=False, output_dir=tmp_path / "run")
    error = fit_until_interrupted(cfg, "stopped at once by a second SIGINT")
    assert error.exit_code == 130
    assert not (tmp_path / "save").exists()  # no step completed, nothing half written
