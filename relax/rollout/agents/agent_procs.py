"""One agent program run (``--agent-command``) as a process the trainer contains: its own
process group, a private directory, a deadline, and bounded reads of what it leaves behind.

- **Process group.** The program starts in a new session (its own process group); when its
  episode ends -- it exited, ran past ``--agent-timeout`` (its own time: not the time its
  calls wait for their answers), or the step was cut short by an
  error or a signal -- the whole group is killed (SIGKILL), so tool servers or shells it
  started do not outlive it. A child that leaves the group on purpose (``setsid``) is out
  of reach; that needs a container.
- **Private directory.** Each run gets a directory of its own, named by a random token
  (never its session id), inside a parent the trainer owns with mode ``0o300`` (no listing):
  an agent sees its own input, output and log files, not the other episodes' files and
  session ids. A process of the same user (or root) can still read the others'
  ``/proc/PID/environ``: separating agents from each other beyond that takes separate users
  or containers.
- **Bounded reads.** The reward file is read up to ``MAX_OUTPUT_BYTES``; the log only its
  last ``TAIL_CHARS`` bytes.
"""

from __future__ import annotations

import json
import numbers
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time

from relax.errors import InputError
from relax.plugins import bad_reward

TAIL_CHARS = 600
MAX_OUTPUT_BYTES = 1 << 20  # {"reward": number} needs a few bytes


class AgentWorkspace:
    """The parent of the runs' private directories of one step; ``close`` removes it."""

    def __init__(self):
        self.path = tempfile.mkdtemp(prefix="relax-agents-")
        os.chmod(self.path, 0o300)  # enter and create, but not list (for a non-root user)

    def private_dir(self) -> str:
        path = os.path.join(self.path, secrets.token_hex(16))
        os.mkdir(path, 0o700)
        return path

    def close(self) -> None:
        os.chmod(self.path, 0o700)
        shutil.rmtree(self.path, ignore_errors=True)


class AgentProcess:
    """One started run of ``argv`` with ``env``; ``folder`` holds in.json, out.json, log;
    ``sid`` and ``session`` are the endpoint's session of the run."""

    def __init__(self, argv: list[str], env: dict, folder: str, *, command: str,
                 timeout_s: float, sid: str, session):
        self.folder, self.timeout_s, self.sid, self.session = folder, timeout_s, sid, session
        self.log = open(os.path.join(folder, "log"), "wb")
        try:
            self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,
                                         stdout=self.log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        except OSError as e:
            self.log.close()
            raise InputError(f"--agent-command {command}: cannot start it "
                             f"({type(e).__name__}: {e})") from None
        self.deadline = time.monotonic() + timeout_s
        self.killed = False  # ran past its deadline

    def running(self) -> bool:
        return self.proc.poll() is None

    def finished(self) -> bool:
        """Whether the run is over; past its deadline it is killed (then it is over)."""
        if self.proc.poll() is not None:
            return True
        if time.monotonic() > self.deadline:
            self.end()
            self.killed = True
            return True
        return False

    def waited(self, seconds: float) -> None:
        """Leave ``seconds`` the program spent waiting for the endpoint's answer out of its
        deadline: ``--agent-timeout`` bounds the program's own time, so a slow model or a
        batch waiting for a slower agent never fails it."""
        self.deadline += seconds

    def end(self) -> None:
        """Kill whatever is left of the run's process group and reap the program."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # the group is empty
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (uninterruptible I/O): leave it
            pass
        self.log.close()

    def failure(self) -> str | None:
        """Why the run failed by how it ended (None: it exited 0 in time)."""
        if self.killed:
            return f"ran past --agent-timeout {self.timeout_s:g} s and was killed"
        if self.proc.returncode != 0:
            return f"exited with status {self.proc.returncode}"
        return None

    def reward(self) -> tuple[float | None, str | None]:
        """``(reward, None)`` from out.json, or ``(None, why it is not a valid reward)``."""
        path = os.path.join(self.folder, "out.json")
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_OUTPUT_BYTES + 1)
        except OSError as e:
            return None, f"no RELAX_OUTPUT_JSON ({type(e).__name__})"
        if len(raw) > MAX_OUTPUT_BYTES:
            return None, f"RELAX_OUTPUT_JSON is over {MAX_OUTPUT_BYTES} bytes"
        try:
            value = json.loads(raw)["reward"]
        except RecursionError:
            return None, "RELAX_OUTPUT_JSON is nested too deeply"
        except (ValueError, KeyError, TypeError, IndexError) as e:
            return None, f"RELAX_OUTPUT_JSON is not an object with a reward ({type(e).__name__})"
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return None, f"the reward is {type(value).__name__}, not a number"
        try:
            reward = float(value)
        except OverflowError:
            return None, "the reward does not fit in a float"
        problem = bad_reward(reward)  # rewards become float32 tensors: -1e300 is -inf there
        return (reward, None) if problem is None else (None, f"the reward is {problem}")

    def tail(self) -> str:
        """The last lines of the run's output, one line (only the end of the log is read)."""
        path = os.path.join(self.folder, "log")
        try:
            with open(path, "rb") as f:
                f.seek(max(0, os.path.getsize(path) - TAIL_CHARS))
                text = f.read(TAIL_CHARS).decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line for line in text.splitlines() if line.strip())
