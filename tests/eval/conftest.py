"""The built-in tiny model and tokenizer, built once per module (no download, seed-fixed)."""

from __future__ import annotations

import random

import pytest


@pytest.fixture(scope="package")
def tiny():

    from relax.tiny_model import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer()
    return build_tiny_model(tokenizer, seed=3), tokenizer


@pytest.fixture(scope="package")
def tiny_checkpoint(tiny, tmp_path_factory):
    """The tiny model saved as a Hugging Face directory (what relax train --save writes)."""
    model, tokenizer = tiny
    path = tmp_path_factory.mktemp("ckpt")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def copy_prompts(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    from relax.rollout.prompts.tasks import get_task

    rng = random.Random(seed)
    pairs = [get_task("copy").sample(rng) for _ in range(n)]
    return [p for p, _ in pairs], [y for _, y in pairs]
