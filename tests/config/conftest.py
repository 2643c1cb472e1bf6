"""Shared fixtures: call ``relax.cli.main`` in-process with captured output."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass

import pytest

from relax.cli import main
from relax.config import TrainConfig
from relax.config.files import flatten


@dataclass
class Result:
    code: int
    out: str
    err: str

    def config(self) -> dict:
        """The dry run's configuration by flag name (the JSON is by section)."""
        assert self.code == 0, self.err
        return flatten(json.loads(self.out), TrainConfig, "--dry-run")


def run_cli(argv: list[str]) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # main must not raise it; report it as a failure code
            code = f"SystemExit({e.code})"
    return Result(code, out.getvalue(), err.getvalue())


def assert_rejected(result, *needles: str) -> str:
    assert result.code == 2, (result.code, result.out, result.err)
    assert result.out == ""
    assert result.err.count("\n") == 1 and result.err.endswith("\n"), result.err
    line = result.err.rstrip("\n")
    assert line.startswith("relax train: error: --"), line
    assert "Traceback" not in line
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.fixture
def rejected():
    """``rejected(result, *needles)``: exit 2, one stderr line naming each needle."""
    return assert_rejected


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    """No torchrun variables leak in from the caller's shell."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"input": "1+1=", "label": "2"}\n')
    return str(path)


@pytest.fixture
def hf_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return str(path)
