"""The preloader's own failures (preloaded.py), with stand-ins that say they are ready and then
misbehave: one that never forks the command fails the test naming the command and what the
preloader did; one that ends before forking lets the command run in a fresh process."""

from __future__ import annotations

import os

import pytest

from tests import preloaded

pytestmark = pytest.mark.subprocess

READY = 'import json, sys, time\nprint(json.dumps({"ready": True}), flush=True)\n'


def _stand_in(monkeypatch, code: str) -> preloaded._Preloader:
    """A preloader running ``code`` after saying it is ready, as this worker's preloader."""
    loader = preloaded._Preloader(dict(os.environ), code=READY + code)
    monkeypatch.setattr(preloaded, "_PRELOADER", loader)
    return loader


def test_a_preloader_that_never_forks_fails_naming_the_command(monkeypatch, tmp_path):
    monkeypatch.setattr(preloaded, "FORK_WAIT_S", 0.2)
    loader = _stand_in(monkeypatch, "sys.stdin.readline()\ntime.sleep(60)\n")
    try:
        with pytest.raises(AssertionError) as e:
            preloaded.run(["train", "--num-rollout", "2"], env=dict(os.environ),
                          base_env=dict(os.environ), cwd=str(tmp_path), timeout=5)
        assert str(e.value) == (
            f"relax train --num-rollout 2: the preloader (pid {loader.proc.pid}, "
            "tests/preloaded.py) is running but forked nothing within 0.2 s; it is "
            "stopped and the next command starts a fresh one")
        assert loader.proc.poll() is not None  # stopped, not left to fail the next command
    finally:
        loader.close()


def test_a_preloader_gone_before_forking_runs_the_command_fresh(monkeypatch, tmp_path):
    loader = _stand_in(monkeypatch, "sys.stdin.readline()\nsys.exit(3)\n")
    try:
        out = preloaded.run(["--version"], env=dict(os.environ), base_env=dict(os.environ),
                            cwd=str(tmp_path), timeout=60)
        assert (out.returncode, out.stdout.split()[0]) == (0, "relax")
        assert loader.proc.poll() == 3 and preloaded._PRELOADER is None
    finally:
        loader.close()
