"""The tiny Qwen3-MoE (relax/tiny_model.py ``build_tiny_moe``) in every pass layout: per-token
log-probs equal an unpadded forward of each row alone, in float64; gradients of the packed
passes equal the padded forward's (LoRA on the attention, recompute); bf16 within its rounding.

The reference runs each row's attended tokens alone (no padding, no pack) through the Hugging
Face model and takes a float64 log-softmax written here. In float64 the router and the norms
are patched to keep float64 (transformers computes the router's softmax and the RMSNorm
statistics in float32 whatever the input), and the experts run transformers' ``eager`` loop
(its ``grouped_mm`` kernel has no float64 form)."""

import dataclasses

import pytest
import torch

from relax.tiny_model import build_tiny_moe, build_tokenizer
from relax.trainer.policy.logprobs import response_log_probs
from relax.trainer.policy.packing import packing_supported
from relax.trainer.policy.recompute import apply_recompute
from tests.trainer.policy.test_packing import (
    PROD,
    TOL,
    P,
    T,
    _assert_equal,
    _norm_in_input_dtype,
    _run,
    ragged_batch,
)

LAYOUTS = ("padded", "packed", "shared-prefix")


def _router_in_input_dtype(self, hidden_states):
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    logits = torch.nn.functional.linear(hidden_states, self.weight)
    top, index = torch.topk(torch.softmax(logits, dim=-1), self.top_k, dim=-1)
    if self.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    return logits, top, index


@pytest.fixture(autouse=True)
def float64_moe(monkeypatch):
    from transformers.models.qwen3_moe import modeling_qwen3_moe as m

    monkeypatch.setattr(m.Qwen3MoeRMSNorm, "forward", _norm_in_input_dtype)
    monkeypatch.setattr(m.Qwen3MoeTopKRouter, "forward", _router_in_input_dtype)


def tiny_moe(dtype=torch.float64, seed: int = 3, **overrides):
    model = build_tiny_moe(build_tokenizer(), seed=seed, **overrides).to(dtype)
    if dtype == torch.float64:
        model.set_experts_implementation("eager")
    with torch.no_grad():  # a router that is not ~uniform: routing decides something
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


def unpadded_reference(model, exp, temperature: float = 0.8) -> torch.Tensor:
    """[B, T] float64 log-probs, each row's attended tokens run alone (0 past its response)."""
    out = torch.zeros(exp.input_ids.shape[0], T, dtype=torch.float64)
    for i in range(exp.input_ids.shape[0]):
        keep = exp.attention_mask[i].bool()
        ids = exp.input_ids[i][keep][None]
        n = int(exp.attention_mask[i, P:].sum())
        if not n:
            continue
        logits = model(input_ids=ids, use_cache=False).logits[0, -n - 1:-1].double()
        logp = torch.log_softmax(logits / temperature, -1)
        out[i, :n] = logp.gather(-1, ids[0, -n:, None])[:, 0]
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
def test_log_probs_in_every_layout_equal_each_row_run_alone(layout):
    model = tiny_moe()
    assert packing_supported(model)
    exp = ragged_batch(model.config.vocab_size)
    attended = exp.attention_mask[:, P:].bool()
    with torch.no_grad():
        want = unpadded_reference(model, exp)
        got, _ = response_log_probs(model, exp, temperature=0.8, layout=layout)
    torch.testing.assert_close(got.double()[attended], want[attended], **PROD)


@pytest.mark.parametrize("share", [False, True], ids=["packed", "shared-prefix"])
def test_pack_gradients_equal_the_padded_forward(share):
    """Router, experts, attention: every parameter's gradient, float64 to 1e-10."""
    model = tiny_moe()
    exp = ragged_batch(model.config.vocab_size)
    ref = _run(model, exp, None, reference=True)
    assert any("experts" in n for n in ref[2]) and any("gate.weight" in n for n in ref[2])
    _assert_equal(ref, _run(model, exp, None, share=share), **TOL)
    _assert_equal(ref, _run(model, exp, "shared-prefix" if share else "packed"), **PROD)


def test_lora_on_the_attention_and_recompute():
    """LoRA's default targets on a mixture of experts are the attention projections (the
    experts are 3-D parameters, not linear layers); the adapted model trains in every layout
    and a recomputed one gives the same gradients."""
    from relax.trainer.policy.lora import add_lora, default_targets

    model = tiny_moe(torch.float32)
    targets = default_targets(model)
    assert targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    add_lora(model, rank=4, alpha=8, dropout=0.0, targets=targets, seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    model = model.double()
    model.set_experts_implementation("eager")
    exp = ragged_batch(model.config.vocab_size)
    ref = _run(model, exp, None, reference=True)
    assert ref[2] and all("lora_" in n for n in ref[2])
    _assert_equal(ref, _run(model, exp, "shared-prefix"), **PROD)
    from relax.config.sections import RecomputeSection

    plain = tiny_moe()
    ref = _run(plain, exp, None, reference=True)
    assert apply_recompute(plain, RecomputeSection("full", None, None))
    _assert_equal(ref, _run(plain, exp, "packed"), **PROD)


def test_bf16_within_its_rounding(monkeypatch):
    monkeypatch.undo()  # the model's own float32 router and norms, as a bf16 run has them
    model = tiny_moe(torch.float32)
    exp = dataclasses.replace(ragged_batch(model.config.vocab_size), old_log_probs=None,
                              ref_log_probs=None)
    attended = exp.attention_mask[:, P:].bool()
    with torch.no_grad():
        exact, _ = response_log_probs(model, exp, layout="padded")
        errors = {}
        for layout in LAYOUTS:
            got, _ = response_log_probs(model, exp, bf16=True, layout=layout)
            errors[layout] = (got - exact)[attended].abs().max().item()
    assert all(e < 0.1 for e in errors.values()), errors
