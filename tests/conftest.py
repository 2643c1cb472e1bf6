"""Fixtures shared across test packages."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """The built-in tiny model and tokenizer saved as a Hugging Face directory (seed 0), for
    tests that run `relax` on a model directory. Read only: no test may write into it."""
    from relax.rollout.tiny_model import build_tiny_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, seed=0).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
