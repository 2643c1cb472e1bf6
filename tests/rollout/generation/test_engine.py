"""The rollout engine computes the model's own function: logits against the Hugging Face forward
run in float64 over the full sequence, for every architecture it accepts; the fallback for the
rest; one prefill per distinct prompt; the same sampled tokens as the model-forward decode."""

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    Qwen2Config,
    Qwen3Config,
    Qwen3MoeConfig,
)

import relax.rollout.generation.generate as generate_module
from relax.rollout.generation.engine import DecodeEngine, unsupported_reason
from relax.rollout.generation.generate import generate, tokenize_prompts
from relax.tiny_model import build_tiny_model, build_tiny_moe, build_tokenizer

EOS, PAD = 1, 0
DIMS = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _model(config):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).double().eval()
    if config.model_type == "qwen3_moe":  # transformers' grouped_mm has no float64 kernel
        model.set_experts_implementation("eager")
    with torch.no_grad():  # non-trivial norm weights and biases, so a dropped one shows
        for p in model.parameters():
            p.add_(0.2 * torch.randn_like(p))
    return model


CONFIGS = {
    "qwen3": lambda: Qwen3Config(**DIMS, head_dim=8, rope_theta=1000.0),
    "qwen2 (qkv bias)": lambda: Qwen2Config(**DIMS, rope_theta=5000.0),
    "llama (bias, untied head)": lambda: LlamaConfig(**DIMS, attention_bias=True, mlp_bias=True,
                                                     tie_word_embeddings=False),
    "llama3 rope scaling": lambda: LlamaConfig(**DIMS, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    # mixture of experts: top-2 of 4 renormalized (Qwen3-30B-A3B's router); top-3 of 5 with
    # the full softmax's weights and a dense first layer (``mlp_only_layers``)
    "qwen3_moe": lambda: Qwen3MoeConfig(**DIMS, head_dim=8, moe_intermediate_size=16,
                                        num_experts=4, num_experts_per_tok=2,
                                        norm_topk_prob=True),
    "qwen3_moe (dense layer, unnormalized top-3)": lambda: Qwen3MoeConfig(
        **DIMS, head_dim=8, moe_intermediate_size=16, num_experts=5, num_experts_per_tok=3,
        norm_topk_prob=False, mlp_only_layers=[0]),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_the_model_forward(name):
    model = _model(CONFIGS[name]())
    assert unsupported_reason(model) is None
    _assert_engine_matches(model)


def test_lora_layers_match_the_peft_forward():
    """A peft LoRA model (every linear layer and the head adapted, B non-zero) decodes through
    the engine with the adapter's low-rank path; switched off, the base model's function."""
    from relax.trainer.policy.lora import adapter_disabled, add_lora

    model = _model(CONFIGS["llama (bias, untied head)"]())
    tuner = add_lora(model, rank=4, alpha=8, dropout=0.0,
                     targets=["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "lm_head"])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn_like(p))
    model = model.double()
    assert unsupported_reason(model) is None
    _assert_engine_matches(model)
    with adapter_disabled(tuner):
        _assert_engine_matches(model)


def test_lora_dropout_falls_back_to_the_model_forward():
    from relax.trainer.policy.lora import add_lora

    model = _model(CONFIGS["qwen3"]())
    add_lora(model, rank=4, alpha=8, dropout=0.1, targets=["q_proj"])
    assert unsupported_reason(model) == ("peft layer Linear (the engine runs plain LoRA linear "
                                         "layers)")


def _assert_engine_matches(model):
    g = torch.Generator().manual_seed(1)
    # left-padded prompts of lengths 2..5, two of them repeated (a group shares its prompt)
    lengths = [5, 2, 5, 3, 2]
    ids = torch.full((5, 5), PAD)
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, 5 - n:] = torch.randint(2, 40, (n,), generator=g)
        mask[i, 5 - n:] = True
    ids[2], ids[4] = ids[0], ids[1]
    T = 7
    response = torch.randint(2, 40, (5, T), generator=g)

    full = torch.cat([ids, response], 1)
    full_mask = torch.cat([mask, torch.ones(5, T, dtype=torch.bool)], 1).long()
    positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        expected = model(input_ids=full, attention_mask=full_mask,
                         position_ids=positions).logits[:, 4:-1]  # predicts response 0..T-1
        engine = DecodeEngine(model)
        got = [engine.prefill(ids, mask, T)]
        got += [engine.step(response[:, t]) for t in range(T - 1)]
    # the model's RMSNorm takes its statistics in float32 even in a float64 model
    torch.testing.assert_close(torch.stack(got, 1), expected, atol=1e-5, rtol=1e-5)


def test_unsupported_models_are_named_and_decoded_by_their_own_forward():
    sliding = Qwen2Config(**DIMS, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    gelu = LlamaConfig(**DIMS, hidden_act="gelu")
    assert "sliding" in unsupported_reason(_model(sliding))
    assert "hidden_act" in unsupported_reason(_model(gelu))
    with pytest.raises(ValueError, match="cannot run this model: hidden_act"):
        DecodeEngine(_model(gelu))

    model = _model(sliding)
    ids = torch.tensor([[3, 4, 5]])
    r = generate(model, ids, torch.ones_like(ids, dtype=torch.bool), max_new_tokens=4,
                 eos_token_ids=[EOS], pad_token_id=PAD, temperature=0.0)
    with torch.no_grad():  # greedy through the fallback: argmax of the model's own forward
        seq = torch.cat([ids, r.response_ids], 1)
        expected = model(input_ids=seq).logits[0, 2:-1].argmax(-1)
    n = int(r.response_mask.sum())
    assert r.response_ids[0, :n].tolist() == expected[:n].tolist()


def test_each_distinct_prompt_is_prefilled_once():
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=3).eval()
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    ids, mask = tokenize_prompts(tok, [p for p in ("ab=", "abcd=", "1+2=") for _ in range(4)], "cpu")
    try:
        generate(model, ids, mask, max_new_tokens=3, eos_token_ids=[EOS], pad_token_id=PAD,
                 generator=torch.Generator().manual_seed(0))
    finally:
        hook.remove()
    assert seen[0] == (3, 5)  # prefill: 3 distinct prompts of 12 rows
    assert all(s == (12,) for s in seen[1:])  # then one token for each of the 12 rows


def test_engine_samples_the_tokens_the_model_forward_samples(monkeypatch):
    """Same seed, same tokens -- also after the engine stopped computing rows that ended (the
    model forward keeps every row to the end)."""
    tok = build_tokenizer()
    model = build_tiny_model(tok, seed=5).eval()
    prompts = [p for p in ("12+3=", "ab=", "x=", "7*7=") for _ in range(16)]
    ids, mask = tokenize_prompts(tok, prompts, "cpu")
    kept = []
    keep = DecodeEngine.keep
    monkeypatch.setattr(DecodeEngine, "keep", lambda self, rows: kept.append(len(rows)) or
                        keep(self, rows))

    def run():
        return generate(model, ids, mask, max_new_tokens=40, eos_token_ids=[EOS],
                        pad_token_id=PAD, generator=torch.Generator().manual_seed(11))

    lean = run()
    monkeypatch.setattr(generate_module, "unsupported_reason", lambda model: "forced")
    reference = run()
    assert len(kept) >= 2 and kept[-1] < 56, kept  # rows were dropped, more than once
    assert torch.equal(lean.response_ids, reference.response_ids)
    assert torch.equal(lean.response_mask, reference.response_mask)
    assert torch.equal(lean.truncated, reference.truncated)
    # the sampler's log-probs too: rows dropped from the engine keep theirs, 0 after the mask
    torch.testing.assert_close(lean.log_probs, reference.log_probs, atol=1e-5, rtol=0)
    assert (lean.log_probs[~lean.response_mask] == 0).all()


@pytest.mark.parametrize("seed", [5, 6])
def test_the_engine_samples_the_tiny_moe_as_the_model_forward_does(monkeypatch, seed):
    """The tiny Qwen3-MoE (relax/tiny_model.py) through the engine: the generic loop's tokens
    for a seeded run, the sampler's log-probs within float rounding."""
    tok = build_tokenizer()
    model = build_tiny_moe(tok, seed=seed).eval()
    assert unsupported_reason(model) is None
    prompts = [p for p in ("12+3=", "ab=", "x=", "7*7=") for _ in range(8)]
    ids, mask = tokenize_prompts(tok, prompts, "cpu")

    def run():
        return generate(model, ids, mask, max_new_tokens=24, eos_token_ids=[EOS],
                        pad_token_id=PAD, generator=torch.Generator().manual_seed(11))

    lean = run()
    monkeypatch.setattr(generate_module, "unsupported_reason", lambda model: "forced")
    reference = run()
    assert torch.equal(lean.response_ids, reference.response_ids)
    assert torch.equal(lean.response_mask, reference.response_mask)
    torch.testing.assert_close(lean.log_probs, reference.log_probs, atol=1e-5, rtol=0)
    assert lean.response_mask.sum() > 32  # the runs sampled something to compare
