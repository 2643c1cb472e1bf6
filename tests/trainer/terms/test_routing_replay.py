"""Routing replay (relax/trainer/terms/routing_replay.py) on the tiny Qwen3-MoE in float64.

The sampler stands in for an inference engine whose numerics flip experts: its top-k choice
is made on the router logits plus noise (the gate weights of the chosen experts come from the
exact logits, as the router weighs its own choice). Forcing its recorded experts (R3) in the
trainer's passes, in every layout, gives the sampler's own log-probs (to the float32 rounding
of the sampler's stored log-probs); the router's own routing does not. The mismatch metrics
count the flips and 0 after replay; R2 replays the old pass's routing."""

import dataclasses

import pytest
import torch

import relax.rollout.generation.experts as experts_module
from relax.algorithms.routing import replayed_gate_weights
from relax.config.sections import OffPolicySection
from relax.errors import InputError
from relax.metrics.tracker import MetricTracker
from relax.rollout.generation.generate import generate, tokenize_prompts
from relax.tiny_model import build_tiny_model, build_tiny_moe, build_tokenizer
from relax.trainer.policy.experience import experience_from_rollout
from relax.trainer.policy.logprobs import response_log_probs
from relax.trainer.terms.router import RouterCapture, sparse_blocks
from relax.trainer.terms.routing_replay import RoutingReplay

LAYOUTS = ("padded", "packed", "shared-prefix")


def _noisy_route(logits, k, normalize):
    noise = torch.randn(logits.shape, generator=_noisy_route.g, dtype=logits.dtype)
    chosen = torch.topk(logits + 0.3 * noise, k, dim=-1).indices
    return replayed_gate_weights(logits, chosen, normalize), chosen


def _moe():
    model = build_tiny_moe(build_tokenizer(), seed=6).double().eval()
    model.set_experts_implementation("eager")
    with torch.no_grad():  # a router far from uniform: its choice changes the function
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
    return model


def _sampled(model, monkeypatch):
    """A batch the noisy sampler drew, with its record and its log-probs."""
    _noisy_route.g = torch.Generator().manual_seed(9)
    monkeypatch.setattr(experts_module, "top_k_route", _noisy_route)
    tok = build_tokenizer()
    ids, mask = tokenize_prompts(tok, [p for p in ("12+3=", "ab=", "x=") for _ in range(3)],
                                 "cpu")
    r = generate(model, ids, mask, max_new_tokens=10, eos_token_ids=[1], pad_token_id=0,
                 generator=torch.Generator().manual_seed(3))
    monkeypatch.undo()
    return r, experience_from_rollout(r)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forcing_the_recorded_experts_gives_the_sampler_log_probs(monkeypatch, layout):
    model = _moe()
    r, exp = _sampled(model, monkeypatch)
    mask = exp.response_mask
    # the record covers every attended column but perhaps a row's last token, whose routing
    # changes no log-prob (nothing is predicted from it)
    replay = RoutingReplay(model, "rollout")
    with torch.no_grad():
        got, _ = response_log_probs(model, exp, layout=layout)
    torch.testing.assert_close(got[mask], r.log_probs[mask], atol=2e-6, rtol=0)
    replay.mode = None
    with torch.no_grad():
        own, _ = response_log_probs(model, exp, layout=layout)
    assert (own - r.log_probs)[mask].abs().max() > 1e-3  # the flips changed log-probs
    replay.close()


def test_the_mismatch_metrics_with_and_without_replay(monkeypatch):
    model = _moe()
    _, exp = _sampled(model, monkeypatch)
    values = {}
    for mode in (None, "rollout"):
        replay = RoutingReplay(model, mode)
        response_log_probs(model, exp, layout="packed")[0].sum().backward()  # a grad pass
        tracker = MetricTracker()
        replay.after_update(tracker)
        values[mode] = tracker.reduce()
        replay.close()
    # reference: the router's own top-k set against the record, counted here
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, o: chosen.append(o[2]))
             for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
              position_ids=exp.position_ids)
    for h in hooks:
        h.remove()
    rec = exp.routed_experts.long()
    have = (rec >= 0).all(-1)  # [B, S, L]
    own = torch.stack([c.view(*exp.input_ids.shape, -1) for c in chosen], 2)
    differs = (own.sort(-1).values != rec.sort(-1).values).any(-1) & have
    want = differs.sum().item() / have.sum().item()
    assert want > 0.01  # the noisy sampler flipped some
    assert values[None]["train/moe_routing_mismatch"] == pytest.approx(want)
    assert values[None]["train/moe_replayed_routing_mismatch"] == pytest.approx(want)
    assert values["rollout"]["train/moe_routing_mismatch"] == pytest.approx(want)
    assert values["rollout"]["train/moe_replayed_routing_mismatch"] == 0.0


def test_r2_replays_the_old_routing_in_the_update(monkeypatch):
    model = _moe()
    _, exp = _sampled(model, monkeypatch)
    replay = RoutingReplay(model, "old")
    replay.before_update(exp, None, {"micro_batch_size": 4})
    with torch.no_grad():
        before, _ = response_log_probs(model, exp, layout="padded")
        for layer in model.model.layers:  # a moved router: its own choice changes
            layer.mlp.gate.weight.add_(torch.randn(layer.mlp.gate.weight.shape,
                                                   generator=torch.Generator().manual_seed(4),
                                                   dtype=torch.float64))
        capture = RouterCapture(sparse_blocks(model))  # after the replay's hooks: what is used
        replayed, _ = response_log_probs(model, exp, layout="padded")
        used = torch.stack([u for _, u in capture.take()], 1)  # [B * S, L, k]
        for h in capture.handles:
            h.remove()
        replay.mode = None
        own, _ = response_log_probs(model, exp, layout="packed")
    old = exp.old_routed_experts
    assert old.shape == exp.routed_experts.shape
    assert ((old >= 0).all(-1) == exp.attention_mask.bool()[..., None]).all()
    # the update's forward used the old policy's experts on every attended token
    flat_old = old.reshape(-1, *old.shape[2:]).long()
    real = exp.attention_mask.reshape(-1).bool()
    assert torch.equal(used[real], flat_old[real])
    # ... which the moved router alone no longer chooses
    assert not torch.allclose(replayed, own)
    assert torch.isfinite(before).all()
    replay.close()


def test_replay_flags_need_a_mixture_of_experts():
    dense = build_tiny_model(build_tokenizer(), seed=0)
    section = dataclasses.replace(OffPolicySection(), use_rollout_routing_replay=True)
    with pytest.raises(InputError, match="--use-rollout-routing-replay: the model"):
        RoutingReplay.build(dense, section)
    assert RoutingReplay.build(dense, OffPolicySection()) is None


@pytest.mark.parametrize("trainer_bf16", [True, False], ids=["bf16 trainer", "fp32 trainer"])
def test_a_bf16_sampler_replayed_within_its_measured_tolerance(trainer_bf16):
    """A bf16 sampler (the engine under autocast) against the trainer with R3: the log-probs
    within 0.02 of the sampler's (measured on this CPU: max |diff| 0.002-0.004 over three
    seeds of this model, bf16 or fp32 trainer; benchmarks/moe_replay.py measures more)."""
    tok = build_tokenizer()
    model = build_tiny_moe(tok, seed=7).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(7))
    ids, mask = tokenize_prompts(tok, [p for p in ("12+3=", "ab=", "x=", "7*7=")
                                       for _ in range(4)], "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = generate(model, ids, mask, max_new_tokens=16, eos_token_ids=[1], pad_token_id=0,
                     generator=torch.Generator().manual_seed(3))
    exp = experience_from_rollout(r)
    replay = RoutingReplay(model, "rollout")
    with torch.no_grad():
        got, _ = response_log_probs(model, exp, layout="packed", bf16=trainer_bf16)
    replay.close()
    diff = (got - r.log_probs)[exp.response_mask].abs()
    assert exp.response_mask.sum() > 50 and diff.max() < 0.02


def test_records_apply_only_to_the_forward_that_follows_begin(monkeypatch):
    """A forward the passes did not begin (a decode through the model's own loop, an
    evaluation) routes itself even while a record of the same shape is left."""
    model = _moe()
    _, exp = _sampled(model, monkeypatch)
    replay = RoutingReplay(model, "rollout")
    flipped = exp.routed_experts.clone()
    flipped[flipped >= 0] = 3 - flipped[flipped >= 0]  # other experts everywhere
    exp.routed_experts = flipped
    with torch.no_grad():
        replayed, _ = response_log_probs(model, exp, layout="padded")
        again = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                      position_ids=exp.position_ids).logits  # the plan of the last begin is left
        replay.mode = None
        own, _ = response_log_probs(model, exp, layout="padded")
        plain = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                      position_ids=exp.position_ids).logits
    assert not torch.allclose(replayed, own)
    assert torch.equal(again, plain)
    replay.close()
