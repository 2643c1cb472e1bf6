"""``--rollout-backend vllm``'s bad input, found before any model loads and told in one line
with exit 2: no vLLM environment (the line names the make target) and a ``--vllm-url``
nothing answers at. No server is needed (tests/rollout/backends/vllm/test_vllm_train.py has the real ones)."""

from __future__ import annotations

import pytest

from relax import models
from relax.trainer import train
from tests.trainer.helpers import make_config


@pytest.fixture
def no_model_load(monkeypatch):
    def boom(*a, **k):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(models, "load_policy", boom)
    monkeypatch.setattr(models, "load_tokenizer", boom)


def _error(cfg, capsys) -> str:
    assert train(cfg) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("relax train: error: "), err
    return err[0]


def test_vllm_not_installed_names_the_make_target(tmp_path, tiny_model_dir, capsys,
                                                  monkeypatch, no_model_load):
    monkeypatch.setenv("RELAX_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    cfg = make_config("--rollout-backend", "vllm", "--hf-checkpoint", str(tiny_model_dir),
                      output_dir=tmp_path / "run")
    line = _error(cfg, capsys)
    assert "vLLM is not installed" in line and "run `make vllm`" in line, line


def test_unreachable_url_stops_before_the_model_loads(tmp_path, tiny_model_dir, capsys,
                                                      no_model_load):
    url = "http://127.0.0.1:9"  # the discard port: nothing listens
    cfg = make_config("--rollout-backend", "vllm", "--hf-checkpoint", str(tiny_model_dir),
                      "--vllm-url", url, output_dir=tmp_path / "run")
    line = _error(cfg, capsys)
    assert f"--vllm-url {url}: no vLLM server answers there" in line, line
