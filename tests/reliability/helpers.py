"""Subprocess runs of ``relax train`` that a test can stop at a known point.

The reward file written by :func:`write_gate_reward` scores like the trainer tests' parity
reward; on its Nth call (``RELAX_GATE_AT``, counted in ``RELAX_GATE_COUNTER``) it creates the
file ``RELAX_GATE_READY`` and waits until the file ``RELAX_GATE_GO`` exists (never, when the
variable is unset). A test polls for the ready file, then acts (kill -9, SIGTERM) while the
run is known to be inside that rollout step. Waiting always has a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

GATE_REWARD = '''
import os, time

def reward(prompts, responses, labels):
    counter = os.environ.get("RELAX_GATE_COUNTER")
    if counter and os.environ.get("RELAX_GATE_RANK", os.environ.get("RANK", "0")) == \\
            os.environ.get("RANK", "0"):
        n = int(open(counter).read()) + 1 if os.path.exists(counter) else 1
        with open(counter, "w") as f:
            f.write(str(n))
        if n == int(os.environ["RELAX_GATE_AT"]):
            open(os.environ["RELAX_GATE_READY"], "w").close()
            go = os.environ.get("RELAX_GATE_GO")
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not (go and os.path.exists(go)):
                time.sleep(0.005)
    return [sum(ord(c) % 2 for c in r) / max(1, len(r)) for r in responses]
'''

SMALL = ["--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "4", "--device", "cpu"]
BASELINE = ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
            "--kl-coef", "0", "--use-kl-loss", "--kl-loss-type", "k2", "--kl-loss-coef", "0.01"]


def write_gate_reward(tmp_path: Path) -> str:
    path = tmp_path / "gate_reward.py"
    path.write_text(GATE_REWARD)
    return f"{path}:reward"


def gate_env(tmp_path: Path, at: int, *, go: bool = False, rank: int | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RELAX_GATE_AT": str(at),
           "RELAX_GATE_COUNTER": str(tmp_path / f"gate_counter_{rank or 0}"),
           "RELAX_GATE_READY": str(tmp_path / "gate_ready")}
    if go:
        env["RELAX_GATE_GO"] = str(tmp_path / "gate_go")
    if rank is not None:
        env["RELAX_GATE_RANK"] = str(rank)
    return env


def start_train(args: list[str], env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "relax", "train", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 90.0) -> None:
    """Poll until ``path`` exists; fail if the child exits first or the deadline passes."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {path.name} "
                                 f"appeared:\n{proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.01)


def finish(proc: subprocess.Popen, timeout: float = 90.0) -> tuple[int, str]:
    """Exit status and stderr; a child still running at the deadline is a hang (killed)."""
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as e:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the run did not exit within {timeout} s (hang):\n{err[-3000:]}") \
            from e
    return proc.returncode, err


def read_rows(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def deterministic(row: dict) -> dict:
    """The metrics a resumed run must reproduce: everything but wall times and memory."""
    return {k: v for k, v in row.items() if not k.startswith("perf/")}


class Child:
    """A ``relax train`` subprocess whose stderr is read by a thread, so a test can wait for a
    line with a deadline instead of blocking on a pipe."""

    def __init__(self, args: list[str], env: dict):
        import threading

        self.proc = start_train(args, env)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, needle: str, timeout: float = 60.0) -> float:
        """Poll the collected lines; returns the monotonic time the line was seen."""
        deadline = time.monotonic() + timeout
        while not any(needle in x for x in self.lines):
            if self.proc.poll() is not None and not self._reader.is_alive():
                raise AssertionError(f"exited before printing {needle!r}:\n" +
                                     "\n".join(self.lines[-30:]))
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"{needle!r} not printed within {timeout} s")
            time.sleep(0.01)
        return time.monotonic()

    def finish(self, timeout: float = 60.0) -> int:
        """Exit status; a child still running at the deadline is a hang (killed, failed)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as e:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not exit within {timeout} s (hang):\n" +
                                 "\n".join(self.lines[-30:])) from e
        self._reader.join(timeout=10)
        return self.proc.returncode

    def errors(self) -> list[str]:
        return [x for x in self.lines if x.startswith("relax train: error:")]


def start_ranks(args: list[str], env: dict, world: int = 2) -> list[Child]:
    """``relax train`` as ``world`` Gloo ranks on 127.0.0.1, started without torchrun. Rank 0
    hosts the store at ``MASTER_PORT``, which stays reserved for as long as the children are
    referenced (relax/ports.py): a port released before rank 0 binds it may be taken."""
    from relax.ports import PortReservation

    reservation = PortReservation()
    port = str(reservation.port)
    children = []
    for rank in range(world):
        rank_env = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port}
        children.append(Child(args, rank_env))
        children[-1].reservation = reservation  # released with the last reference to it
    return children


def kill_left(children: list[Child]) -> None:
    """Kill the children still running (a failed test must not leave ranks behind)."""
    for c in children:
        if c.proc.poll() is None:
            c.proc.kill()


def finish_all(children: list[Child], timeout: float = 90.0) -> list[int]:
    try:
        return [c.finish(timeout) for c in children]
    finally:
        kill_left(children)
