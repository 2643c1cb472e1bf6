"""The router term (relax/trainer/terms/router.py) on the tiny Qwen3-MoE: coefficient 0 leaves
the loss and its gradient exactly as without the term; a coefficient adds coef * share * the
sum over layers of the load-balancing loss, checked against transformers' own
``load_balancing_loss_func`` (k times Megatron's normalization per layer); the step's expert
load and router entropy against loops here; a dense model has no term, and a coefficient for
it is refused."""

import dataclasses
import math

import pytest
import torch

from relax.errors import InputError
from relax.metrics.tracker import MetricTracker
from relax.tiny_model import build_tiny_model, build_tiny_moe, build_tokenizer
from relax.trainer.policy.update import micro_batch_loss
from relax.trainer.terms.router import RouterTerm
from tests.trainer.workers import fixed_experience, settings


def _moe():
    model = build_tiny_moe(build_tokenizer(), seed=2).double()
    model.set_experts_implementation("eager")
    with torch.no_grad():  # an uneven router, so the loss and the load are not trivial
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(5))
    return model


def _loss(model, exp, terms, layout):
    model.zero_grad(set_to_none=True)
    s = dataclasses.replace(settings("grpo"), layout=layout)
    loss, stats = micro_batch_loss(model, exp, s, num_responses=len(exp), num_tokens=None,
                                   terms=terms)
    loss.backward()
    return loss.detach(), stats, {n: p.grad.clone() for n, p in model.named_parameters()}


def _hf_reference(model, exp):
    """Per layer: transformers' loss / k over the attended tokens; and the router logits."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

    with torch.no_grad():
        out = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                    position_ids=exp.position_ids, output_router_logits=True)
    k, E = model.config.num_experts_per_tok, model.config.num_experts
    per_layer = [load_balancing_loss_func((lg,), E, k, exp.attention_mask).item() / k
                 for lg in out.router_logits]
    return per_layer, out.router_logits


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_the_loss_with_and_without_the_coefficient(layout):
    model = _moe()
    exp = fixed_experience(model)
    plain = _loss(model, exp, None, layout)
    off = RouterTerm.build(model, 0.0)
    s = settings("grpo")
    from relax.trainer.policy.update import loss_terms

    without = _loss(model, exp, loss_terms(s, (off,)), layout)
    assert torch.equal(without[0], plain[0])
    for name, g in plain[2].items():
        assert torch.equal(without[2][name], g), name
    coef = 0.3
    on = RouterTerm.build(model, coef)
    with_loss = _loss(model, exp, loss_terms(s, (on,)), layout)
    per_layer, _ = _hf_reference(model, exp)
    share = (exp.response_mask.sum(1) > 0).double().mean().item()  # rows with a token
    if layout == "padded":  # the packed pass counts the same tokens (no padding either way)
        assert (with_loss[0] - plain[0]).item() == pytest.approx(coef * share * sum(per_layer),
                                                                 rel=1e-6)
        assert with_loss[1][-1].item() == pytest.approx(share * sum(per_layer) / len(per_layer),
                                                        rel=1e-6)
    assert with_loss[2]["model.layers.0.mlp.gate.weight"].sub(
        plain[2]["model.layers.0.mlp.gate.weight"]).abs().max() > 0


def test_the_step_metrics_against_loops():
    model = _moe()
    exp = fixed_experience(model)
    term = RouterTerm.build(model, 0.0)
    from relax.trainer.policy.update import loss_terms

    _loss(model, exp, loss_terms(settings("grpo"), (term,)), "padded")
    tracker = MetricTracker()
    term.after_update(tracker)
    got = tracker.reduce()
    _, logits = _hf_reference(model, exp)
    real = exp.attention_mask.reshape(-1).bool().tolist()
    k, E = model.config.num_experts_per_tok, model.config.num_experts
    loads, ent, n = [], 0.0, 0
    for lg in logits:
        counts = [0] * E
        for i, row in enumerate(lg.tolist()):
            if not real[i]:
                continue
            z = [math.exp(v - max(row)) for v in row]
            p = [v / sum(z) for v in z]
            for e in sorted(range(E), key=lambda e: -p[e])[:k]:
                counts[e] += 1
            ent += -sum(q * math.log(q) for q in p)
            n += 1
        loads.append(max(counts) / (sum(counts) / E))
    assert got["train/moe_expert_load_max"] == pytest.approx(sum(loads) / len(loads), rel=1e-9)
    assert got["train/moe_router_entropy"] == pytest.approx(ent / n, rel=1e-9)
    assert 1.0 < got["train/moe_expert_load_max"] <= E / k


def test_a_dense_model_has_no_router_term():
    model = build_tiny_model(build_tokenizer(), seed=0)
    assert RouterTerm.build(model, 0.0) is None
    with pytest.raises(InputError, match="--moe-aux-loss-coef 0.1: the model .*'qwen3'.* has no"):
        RouterTerm.build(model, 0.1)


def test_the_model_own_router_loss_is_switched_off():
    model = build_tiny_moe(build_tokenizer(), seed=0, output_router_logits=True)
    RouterTerm.build(model, 0.0)
    assert model.config.output_router_logits is False


def test_another_mixture_of_experts_family_is_not_taken_for_qwen3_moe():
    """Mixtral's block looks alike but weighs its experts in float32 and always renormalizes:
    it gets no router term, and the MoE flags are refused for it by name."""
    from transformers import AutoModelForCausalLM, MixtralConfig

    cfg = MixtralConfig(vocab_size=40, hidden_size=16, intermediate_size=16,
                        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                        num_local_experts=4, num_experts_per_tok=2)
    model = AutoModelForCausalLM.from_config(cfg)
    assert RouterTerm.build(model, 0.0) is None
    with pytest.raises(InputError, match="'mixtral'.* has no Qwen3-MoE"):
        RouterTerm.build(model, 0.01)
