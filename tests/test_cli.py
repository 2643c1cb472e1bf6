"""The ``relax`` entry point: help, dispatch, dry run without heavy imports (real
subprocesses), one-line rejections, and config.json before the trainer starts."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import types

import pytest

from relax.cli import COMMANDS, main
from relax.config import config_to_json

TIMEOUT = 120  # a hang is a failure; the real runs take well under a second


def call(argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def python(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=TIMEOUT, env=env)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)


def test_help():
    code, out, err = call(["--help"])
    assert code == 0 and err == "" and "train" in out
    code, out, err = call(["train", "--help"])
    assert code == 0 and err == ""
    for title in ("algorithm:", "batches:", "rollout.data:", "optimizer:", "system:", "run:"):
        assert title in out
    assert "reinforce_plus_plus.md §8" in out and "Default 0.2" in out


def test_dispatch_errors_are_one_line():
    for argv, needle in (([], "a command is required"), (["evaluate"], "evaluate")):
        code, out, err = call(argv)
        assert code == 2 and out == "" and err.count("\n") == 1 and needle in err
        assert err.startswith("relax: error: ")
    assert set(COMMANDS) == {"train", "eval", "export", "plot"}


@pytest.mark.subprocess
def test_dry_run_subprocess_prints_json_and_loads_nothing_heavy():
    proc = python("-m", "relax", "train", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    cfg = json.loads(proc.stdout)
    assert cfg["algorithm"]["advantage_estimator"] == "grpo"
    assert cfg["builtin_preset_applied"] is True
    probe = ("import sys, contextlib, io\n"
             "from relax.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    assert main(['train', '--dry-run']) == 0\n"
             "assert main(['train', '--hybrid']) == 2\n"
             "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'safetensors')"
             " if m in sys.modules))\n")
    proc = python("-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.subprocess
def test_rejection_subprocess_is_one_line_without_traceback():
    proc = python("-m", "relax", "train", "--advantage-estimator", "reinforce_plus_plus")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("relax train: error: --advantage-estimator reinforce_plus_plus")
    assert "--normalize-advantages" in proc.stderr


@pytest.fixture
def fake_trainer(monkeypatch):
    """Stand-in for relax.trainer: records the config it gets and returns a chosen status."""
    calls = []
    module = types.ModuleType("relax.trainer")

    def train(cfg):
        calls.append((cfg, os.path.exists(os.path.join(cfg.run.output_dir, "config.json"))))
        return module.status

    module.train = train
    module.status = 0
    monkeypatch.setitem(sys.modules, "relax.trainer", module)
    return module, calls


def test_real_run_writes_config_then_calls_trainer(tmp_path, fake_trainer):
    module, calls = fake_trainer
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("user file")
    code, _, err = call(["train", "--output-dir", str(foreign)])
    assert code == 2 and "holds files Relax did not write (e.g. 'keep.txt')" in err
    assert sorted(p.name for p in foreign.iterdir()) == ["keep.txt"] and not calls
    out = tmp_path / "out"
    out.mkdir()
    module.status = 3
    code, stdout, err = call(["train", "--output-dir", str(out), "--seed", "7"])
    assert (code, err) == (3, "")  # the trainer's status is the exit status
    (cfg, written_before_train), = calls
    assert written_before_train
    saved = json.loads((out / "config.json").read_text())
    assert saved == json.loads(config_to_json(cfg))
    assert saved["run"]["seed"] == 7 and saved["run"]["dry_run"] is False
    # a new directory is created; a rejected run writes nothing and never trains
    code, _, _ = call(["train", "--output-dir", str(tmp_path / "new" / "run")])
    assert code == 3 and (tmp_path / "new" / "run" / "config.json").is_file()
    code, _, err = call(["train", "--output-dir", str(tmp_path / "bad"), "--hybrid"])
    assert code == 2 and not (tmp_path / "bad").exists() and len(calls) == 2


def test_only_rank_zero_writes_config(tmp_path, fake_trainer, monkeypatch):
    _, calls = fake_trainer
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, _, _ = call(["train", "--output-dir", str(tmp_path / "r1")])
    assert code == 0 and len(calls) == 1 and calls[0][0].world_size == 2
    assert not (tmp_path / "r1" / "config.json").exists()
