"""Fixtures shared across test packages, and the machine limits the suite gives every run."""

from __future__ import annotations

import os

import pytest

# Known figures instead of the start-up benchmark of every in-process trainer (a 1024^3 matmul
# and a 128 MB copy; relax/trainer/flops.py). Set in os.environ, so child processes inherit
# them. tests/trainer/test_flops.py clears them where the measurement itself is under test.
MACHINE_LIMITS = {"RELAX_PEAK_TFLOPS": "1", "RELAX_MEMORY_BANDWIDTH_GBPS": "10"}


def pytest_configure(config):
    for name, value in MACHINE_LIMITS.items():
        os.environ.setdefault(name, value)


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
