"""The sampler's routing record (relax/rollout/generation/experts.py): the experts the decode's
forward of each token used, per MoE layer -- equal to the router's choice in a full forward
of the sampled sequence (float64), the same through the engine and the generic loop, -1 on
padding (and on a row's last token when no forward of it ran)."""

import pytest
import torch

import relax.rollout.generation.generate as generate_module
from relax.rollout.generation.generate import concat_rollouts, generate, tokenize_prompts
from relax.tiny_model import build_tiny_moe, build_tokenizer

EOS, PAD = 1, 0


def _moe():
    model = build_tiny_moe(build_tokenizer(), seed=6).double().eval()
    model.set_experts_implementation("eager")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0, 1.0, generator=torch.Generator().manual_seed(2))
    return model


def _run(model, ids, mask):
    return generate(model, ids, mask, max_new_tokens=12, eos_token_ids=[EOS], pad_token_id=PAD,
                    generator=torch.Generator().manual_seed(3))


def _full_forward_choice(model, r, i):
    """[n, layers, k] the routers' top-k in one forward of row i's attended tokens."""
    chosen = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, a, o: chosen.append(o[2]))
             for layer in model.model.layers]
    keep = torch.cat([r.prompt_mask[i], r.response_mask[i]])
    ids = torch.cat([r.prompt_ids[i], r.response_ids[i]])[keep][None]
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack(chosen, 1), keep


@pytest.mark.parametrize("engine", [True, False], ids=["engine", "generic loop"])
def test_the_record_is_the_routers_choice_in_a_full_forward(monkeypatch, engine):
    tok = build_tokenizer()
    model = _moe()
    ids, mask = tokenize_prompts(tok, [p for p in ("12+3=", "ab=", "x=") for _ in range(3)],
                                 "cpu")
    if not engine:
        monkeypatch.setattr(generate_module, "unsupported_reason", lambda model: "forced")
    r = _run(model, ids, mask)
    B, P = ids.shape
    T = r.response_ids.shape[1]
    assert r.routed_experts.shape == (B, P + T, 2, 2) and r.routed_experts.dtype == torch.int16
    for i in range(B):
        want, keep = _full_forward_choice(model, r, i)
        got = r.routed_experts[i][keep]
        n = int(r.response_mask[i].sum())
        # every attended column recorded but perhaps the last token drawn (fed only when
        # other rows still decoded)
        assert (got[:-1] >= 0).all() and n >= 1
        # the same experts (a set: top-k of equal probabilities may come in another order)
        assert torch.equal(got[:-1].long().sort(-1).values, want[:-1].sort(-1).values)
        assert (r.routed_experts[i][~keep] == -1).all()


def test_engine_and_generic_loop_records_agree_and_concatenate(monkeypatch):
    tok = build_tokenizer()
    model = _moe()
    ids, mask = tokenize_prompts(tok, ["7*7=", "7*7=", "a="], "cpu")
    lean = _run(model, ids, mask)
    monkeypatch.setattr(generate_module, "unsupported_reason", lambda model: "forced")
    reference = _run(model, ids, mask)
    assert torch.equal(lean.response_ids, reference.response_ids)
    assert torch.equal(lean.routed_experts, reference.routed_experts)
    short = lean.select([2])
    both = concat_rollouts([short, lean.select([0, 1])], PAD)
    # each row keeps its record at its tokens' columns, -1 in the added padding
    assert torch.equal(both.routed_experts[1:], lean.routed_experts[:2])
    P, T = ids.shape[1], lean.response_ids.shape[1]
    assert torch.equal(both.routed_experts[0, :P], lean.routed_experts[2, :P])
    assert torch.equal(both.routed_experts[0, P:P + T], lean.routed_experts[2, P:])


def test_a_dense_model_has_no_record():
    from relax.tiny_model import build_tiny_model

    tok = build_tokenizer()
    ids, mask = tokenize_prompts(tok, ["a="], "cpu")
    assert _run(build_tiny_model(tok, seed=0), ids, mask).routed_experts is None
