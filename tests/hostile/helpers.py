"""Real ``relax`` subprocesses for the hostile-conditions suite (docs/reliability.md, "Hostile
conditions"): every case runs the command as a user would, on real files, and checks the exit
status, that stderr is one ``relax <cmd>: error:`` line, and what is left on disk."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests import preloaded

TIMEOUT = 180  # a hang is a failure
SMALL = ["--num-rollout", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
         "--rollout-max-response-len", "3", "--device", "cpu", "--log-samples", "0"]


def env(**extra) -> dict:
    out = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    out.update(OMP_NUM_THREADS="1", **extra)
    return out


def relax(*args, cwd=None, extra_env=None, timeout=TIMEOUT) -> subprocess.CompletedProcess:
    """``python -m relax ARGS``, forked from a process that has done its imports
    (preloaded.py: the same run, without 4 s of imports per case)."""
    return preloaded.run(list(args), env=env(**(extra_env or {})), base_env=env(), cwd=cwd,
                         timeout=timeout)


def one_error_line(out: subprocess.CompletedProcess, command: str = "train") -> str:
    """The single error line of a failed run (warnings before it are allowed)."""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(f"relax {command}: error: ")]
    assert len(errors) == 1, out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    return errors[0]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
