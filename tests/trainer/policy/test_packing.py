"""Packed and prefix-shared passes (relax/trainer/policy/packing.py) equal the padded ones: per-token
log-probs, entropies and parameter gradients in float64 (Qwen3 and Llama, LoRA, recompute,
ragged groups, two Gloo ranks), bf16 within its rounding, and a seeded ``relax train`` run.

The reference is the padded forward written out here (one pass over each padded row with its
2D attention mask and a float64 log-softmax), not the production log-prob code. Two checks
each: the pack's float64 logits through the same float64 log-softmax (:func:`_strict`, equal
to 1e-10), and the production ``response_log_probs`` of each layout (its log-softmax is fp32 by
design, so equal to the reference within fp32 rounding: ``PROD``)."""

import dataclasses

import pytest
import torch

from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy import packing
from relax.trainer.policy.experience import Experience, budget_groups, micro_batches
from relax.trainer.policy.logprobs import pack_layout, response_log_probs, token_slots
from relax.trainer.policy.packing import (
    build_layout,
    packed_forward,
    packing_supported,
    response_mask,
)
from relax.trainer.policy.recompute import apply_recompute
from relax.trainer.policy.update import micro_batch_loss
from tests.distributed_utils import run_distributed
from tests.trainer.helpers import fit, make_config, read_metrics, write_reward
from tests.trainer.workers import B as WB
from tests.trainer.workers import one_step, one_step_cases, settings

P, T = 5, 6
# rows: (prompt id, prompt length, response length); ragged groups: three samples of prompt 0,
# a group of one, four samples of prompt 2 of uneven lengths (one empty, one of length 1)
ROWS = [(0, 5, 6), (0, 5, 2), (0, 5, 4), (1, 2, 3), (2, 3, 6), (2, 3, 0), (2, 3, 1), (2, 3, 5)]
TOL = dict(atol=1e-10, rtol=1e-10)
PROD = dict(atol=2e-6, rtol=1e-5)


def _norm_in_input_dtype(self, hidden_states):
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


@pytest.fixture(autouse=True)
def float64_norms(monkeypatch):
    """Hugging Face's RMSNorm computes in fp32 whatever the input (and its backward casts the
    incoming gradient to fp32): a shared prompt token's gradient, summed over the responses
    before that cast, is rounded once where the padded rows round each share, ~1e-7 apart.
    In the float64 tests the norms stay float64, so any difference left is the packing's."""
    from transformers.models.llama import modeling_llama
    from transformers.models.qwen3 import modeling_qwen3

    monkeypatch.setattr(modeling_qwen3.Qwen3RMSNorm, "forward", _norm_in_input_dtype)
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _norm_in_input_dtype)


def _tiny(family: str = "qwen3", **overrides):
    tok = build_tokenizer()
    if family == "qwen3":
        return build_tiny_model(tok, seed=3, **overrides).double()
    from transformers import AutoModelForCausalLM, LlamaConfig

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=False,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(3)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float64)


def ragged_batch(vocab: int, seed: int = 0) -> Experience:
    """Left-padded prompts (three distinct), right-padded responses, a hole in one loss mask."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (P,), generator=g) for _ in range(3)]
    ids = torch.zeros(len(ROWS), P + T, dtype=torch.long)
    attention = torch.zeros(len(ROWS), P + T, dtype=torch.long)
    for i, (k, lp, lr) in enumerate(ROWS):
        ids[i, P - lp:P] = prompts[k][:lp]
        ids[i, P:P + lr] = torch.randint(3, vocab, (lr,), generator=g)
        attention[i, P - lp:P + lr] = 1
    loss_mask = attention[:, P:].bool().clone()
    loss_mask[0, 3] = False  # read by the model, not trained (a partial rollout's old tokens)
    exp = Experience(ids, attention, (attention.cumsum(-1) - 1).clamp(min=0), loss_mask)
    n = len(ROWS)
    exp.old_log_probs = -1.0 - torch.rand(n, T, generator=g, dtype=torch.float64)
    exp.ref_log_probs = -1.0 - torch.rand(n, T, generator=g, dtype=torch.float64)
    exp.advantages = torch.where(loss_mask, torch.randn(n, T, generator=g), 0.0).double()
    return exp


def padded_reference(model, exp: Experience, temperature: float = 0.8):
    """log-probs and entropies [B, T] of the padded forward, float64 log-softmax."""
    logits = model(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                   position_ids=exp.position_ids, use_cache=False).logits[:, P - 1:-1]
    logp = torch.log_softmax(logits.double() / temperature, -1)
    target = logp.gather(-1, exp.input_ids[:, P:, None]).squeeze(-1)
    return target, -(logp.exp() * logp).sum(-1)


def packed_logits_reference(model, exp: Experience, share: bool, temperature: float = 0.8):
    """:func:`padded_reference` from the pack's float64 logits."""
    pack = build_layout(exp.input_ids, exp.attention_mask, T, share=share)
    logits = packed_forward(model, model, exp.input_ids, exp.position_ids, pack)[pack.predict]
    logp = torch.log_softmax(logits.double() / temperature, -1)
    targets = exp.input_ids[:, P:].reshape(-1)[pack.target]
    n = exp.input_ids.shape[0] * T
    target = logp.new_zeros(n).index_put((pack.target,), logp.gather(-1, targets[:, None])[:, 0])
    entropy = logp.new_zeros(n).index_put((pack.target,), -(logp.exp() * logp).sum(-1))
    return target.view(-1, T), entropy.view(-1, T)


def _run(model, exp, layout, reference=False, share=None):
    """(log-probs, entropies, gradients by name) of ``sum(w * (logp + 0.3 entropy))`` over the
    attended response tokens, w fixed weights: every token's gradient path counts."""
    model.zero_grad(set_to_none=True)
    if reference:
        logp, ent = padded_reference(model, exp)
    elif share is not None:
        logp, ent = packed_logits_reference(model, exp, share)
    else:
        logp, ent = response_log_probs(model, exp, temperature=0.8, with_entropy=True,
                                       layout=layout)
    attended = exp.attention_mask[:, P:].bool()
    w = torch.linspace(0.5, 1.5, attended.numel(), dtype=torch.float64).view_as(logp)
    ((logp.double() + 0.3 * ent.double()) * w * attended).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach().double(), ent.detach().double(), grads, attended


def _assert_equal(ref, got, **tol):
    attended = ref[3]
    torch.testing.assert_close(got[0][attended], ref[0][attended], **tol)
    torch.testing.assert_close(got[1][attended], ref[1][attended], **tol)
    assert got[2].keys() == ref[2].keys() and ref[2]
    for name, g in ref[2].items():
        torch.testing.assert_close(got[2][name], g, msg=name, **tol)
    assert max(g.abs().max() for g in ref[2].values()) > 1e-3


def test_layout_of_a_small_batch():
    """Two samples of one prompt and a row of its own: the prompt once, token 0 of each
    response predicted from the prompt's last position, the rest from the response."""
    ids = torch.tensor([[0, 7, 8, 20, 21], [0, 7, 8, 30, 0], [9, 9, 9, 40, 41]])
    attention = (ids != 0).long()
    lay = build_layout(ids, attention, 2, share=True)
    S = 5
    assert lay.token_index.tolist() == [1, 2, 3, 4, S + 3, 2 * S, 2 * S + 1, 2 * S + 2,
                                        2 * S + 3, 2 * S + 4]
    # pack: [7 8 | 20 21 | 30] [9 9 9 40 41]
    assert lay.predict.tolist() == [1, 2, 1, 7, 8]
    assert lay.target.tolist() == [0, 1, 2, 4, 5]
    first, second = lay.blocks
    assert (first.start, first.prompt_end, first.stop) == (0, 2, 5)
    assert [(b, e) for b, e, _ in first.responses] == [(2, 4), (4, 5)]
    assert first.responses[0][2].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert (second.start, second.stop, second.responses) == (5, 10, ())
    seg = lay.segments  # prompt, two responses over it, the row of its own
    assert seg.query.tolist() == [[0, 1, 0, 0, 0], [2, 3, 0, 0, 0], [4, 0, 0, 0, 0],
                                  [5, 6, 7, 8, 9]]
    assert seg.key[1].tolist()[:4] == [0, 1, 2, 3] and seg.key[2].tolist()[:3] == [0, 1, 4]
    assert seg.mask[2, 0, 0].tolist() == [True, True, True, False, False]
    assert seg.mask[2, 0, 1].tolist() == [True, False, False, False, False]  # padding: key 0
    assert seg.order.tolist() == [0, 1, 5, 6, 10, 15, 16, 17, 18, 19]
    unshared = build_layout(ids, attention, 2, share=False)
    assert unshared.tokens == 12 and all(not b.responses for b in unshared.blocks)
    assert response_mask(1, 2).tolist() == [[True, True, False], [True, True, True]]


def test_holes_in_the_attention_run_padded():
    model = _tiny()
    exp = ragged_batch(model.config.vocab_size)
    assert pack_layout(model, exp, "shared-prefix") is not None
    exp.attention_mask[0, P + 2] = 0  # a token the model would not read
    assert pack_layout(model, exp, "shared-prefix") is None
    assert pack_layout(model, exp, "padded") is None


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("layout", ["shared-prefix", "packed"])
@pytest.mark.parametrize("segments", [True, False], ids=["segments", "blocks"])
def test_log_probs_entropies_and_gradients_equal_the_padded_forward(family, layout, segments,
                                                                     monkeypatch):
    """Both ways of running a pack's attention (relax/trainer/policy/packing.py)."""
    monkeypatch.setattr(packing, "BATCHED_SEGMENTS", segments)
    model = _tiny(family)
    assert packing_supported(model)
    exp = ragged_batch(model.config.vocab_size)
    ref = _run(model, exp, None, reference=True)
    _assert_equal(ref, _run(model, exp, None, share=layout == "shared-prefix"), **TOL)
    _assert_equal(ref, _run(model, exp, "padded"), **PROD)
    _assert_equal(ref, _run(model, exp, layout), **PROD)


def test_the_model_head_path_and_an_untied_output_layer():
    """A model whose log-probs come from its own head (no chunked output layer)."""
    import relax.trainer.policy.logprobs as logprobs

    model = _tiny(tie_word_embeddings=False)
    exp = ragged_batch(model.config.vocab_size)
    ref = _run(model, exp, None, reference=True)
    original = logprobs._output_layer
    logprobs._output_layer = lambda inner: None
    try:
        _assert_equal(ref, _run(model, exp, "shared-prefix"), **PROD)
    finally:
        logprobs._output_layer = original


def test_with_lora_and_with_recompute():
    from relax.config.sections import RecomputeSection
    from relax.trainer.policy.lora import add_lora

    model = build_tiny_model(build_tokenizer(), seed=3)
    tuner = add_lora(model, rank=4, alpha=8, dropout=0.0, targets=["q_proj", "v_proj"], seed=1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=torch.Generator().manual_seed(2)))
    model = model.double()  # the module a LoRA run trains (the tuner wraps it in place)
    assert tuner is not None
    exp = ragged_batch(model.config.vocab_size)
    ref = _run(model, exp, None, reference=True)
    assert any("lora" in n for n in ref[2]) and not any("embed" in n for n in ref[2])
    _assert_equal(ref, _run(model, exp, None, share=True), **TOL)
    _assert_equal(ref, _run(model, exp, "shared-prefix"), **PROD)
    plain = _tiny()
    ref = _run(plain, exp, None, reference=True)
    assert apply_recompute(plain, RecomputeSection("full", None, None))
    _assert_equal(ref, _run(plain, exp, None, share=True), **TOL)
    _assert_equal(ref, _run(plain, exp, "shared-prefix"), **PROD)


def test_bf16_within_its_rounding():
    model = build_tiny_model(build_tokenizer(), seed=3)
    exp = ragged_batch(model.config.vocab_size)
    exp = dataclasses.replace(exp, old_log_probs=None, ref_log_probs=None)
    with torch.no_grad():
        got, _ = response_log_probs(model, exp, bf16=True, layout="shared-prefix")
        padded, _ = response_log_probs(model, exp, bf16=True, layout="padded")
        exact, _ = response_log_probs(model.double(), exp, layout="padded")
    attended = exp.attention_mask[:, P:].bool()
    err_packed = (got.double() - exact)[attended].abs().max()
    err_padded = (padded.double() - exact)[attended].abs().max()
    assert err_packed < 0.05 and err_padded < 0.05
    assert err_packed < 3 * err_padded + 1e-3


def test_update_loss_and_gradients_equal_the_padded_update():
    """micro_batch_loss (policy loss, k2 KL, entropy bonus) under each layout."""
    results = {}
    for layout in ("padded", "packed", "shared-prefix"):
        model = _tiny()
        exp = ragged_batch(model.config.vocab_size)
        s = dataclasses.replace(settings("reinforce_plus_plus_baseline"), layout=layout)
        loss, stats = micro_batch_loss(model, exp, s, num_responses=len(exp), num_tokens=None)
        loss.backward()
        results[layout] = (loss.detach(), stats,
                           {n: p.grad.clone() for n, p in model.named_parameters()})
        slots, tokens = token_slots(model, exp, layout)
        attended = int(exp.attention_mask.sum())
        expected = {"padded": (exp.attention_mask.numel(), attended),
                    "packed": (attended, attended),
                    # prompt 0 (5 tokens) shared by 3 rows, prompt 2 (3 tokens) by 4
                    "shared-prefix": (attended - 2 * 5 - 3 * 3,) * 2}[layout]
        assert (slots, tokens) == expected
    ref = results["padded"]
    for layout in ("packed", "shared-prefix"):
        torch.testing.assert_close(results[layout][0], ref[0], **PROD)
        torch.testing.assert_close(results[layout][1], ref[1], **PROD)
        for name, g in ref[2].items():
            torch.testing.assert_close(results[layout][2][name], g, msg=name, **PROD)


def test_token_budgets_fill_packs_in_row_order():
    assert budget_groups([5, 3, 4, 2, 6], 9, "--max-tokens-per-gpu", packed=True) == [
        [0, 1], [2, 3], [4]]
    # padded: longest first, rows x the longest row within the budget
    assert budget_groups([5, 3, 4, 2, 6], 9, "--max-tokens-per-gpu") == [[4], [0], [2, 1], [3]]
    model = _tiny()
    exp = ragged_batch(model.config.vocab_size)
    lengths = exp.attention_mask.sum(1).tolist()
    for index, _ in micro_batches(exp, size=4, max_tokens=24, flag="--max-tokens-per-gpu",
                                   packed=True):
        assert sum(lengths[i] for i in index.tolist()) <= 24
        assert index.tolist() == sorted(index.tolist())


LAYOUT_CASES = {("shared", fsdp): ("grpo", False, fsdp, WB // 4, False, True)
                for fsdp in (False, True)}


def _two_rank_cases(cases):
    return one_step_cases(cases)


@pytest.mark.subprocess
def test_two_gloo_ranks_with_shared_prefix_equal_one_padded_process():
    """Two ranks (DDP and FSDP2), each packing its groups, against one process that pads."""
    ref_params, ref_hist = one_step("grpo", False, False, WB, False, True, layout="padded")
    results = run_distributed(_two_rank_cases, 2, LAYOUT_CASES, timeout=180)
    for rank, per_case in enumerate(results):
        for key, (status, value) in per_case.items():
            assert status == "ok", f"rank {rank} {key}:\n{value}"
            params, hist = value
            for name, p in ref_params.items():
                torch.testing.assert_close(params[name], p, atol=1e-6, rtol=1e-5, msg=name)
            for name, v in ref_hist[0].items():
                if not name.startswith("perf/"):
                    assert hist[0][name] == pytest.approx(v, rel=1e-5, abs=1e-7), name
            assert hist[0]["perf/update_padding_fraction"] == 0.0
    assert ref_hist[0]["perf/update_padding_fraction"] > 0.0


def test_a_seeded_run_equals_the_padded_run(tmp_path):
    reward = write_reward(tmp_path)
    rows = {}
    for layout in ("padded", "shared-prefix"):
        cfg = make_config("--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-type",
                          "k3", "--kl-loss-coef", "0.05", "--custom-rm-path",
                          f"{reward}:parity", "--pass-layout", layout, "--seed", "5",
                          output_dir=tmp_path / layout)
        trainer, _, _ = fit(cfg)
        # perf/*_mfu count a group's prompt once where the passes run it once
        assert trainer.step_metrics.shared_passes == (layout == "shared-prefix")
        assert trainer.step_metrics.shared_generation  # the decode engine prefills it once
        rows[layout] = read_metrics(tmp_path / layout)
    assert len(rows["padded"]) == len(rows["shared-prefix"]) == 2
    for ref, got in zip(rows["padded"], rows["shared-prefix"], strict=True):
        for name, value in ref.items():
            if name.startswith("perf/") or isinstance(value, str):
                continue
            assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
        assert got["perf/update_padding_fraction"] == 0.0


def _backward_nodes(root) -> set[str]:
    seen, stack, names = set(), [root], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return names


@pytest.mark.parametrize("layout", ["shared-prefix", "packed"])
def test_pack_gathers_backpropagate_in_a_fixed_order(layout):
    """A shared prompt's keys and last position are read by several responses, so the pack's
    gathers repeat indices. ``x[index]`` backpropagates through index_put_(accumulate=True),
    whose CPU kernel adds repeated indices in a thread-dependent order (seeded runs drifted
    apart on a busy machine); the pack gathers with ``packing.take`` (index_select, summed in
    index order) instead, so the graph holds no advanced-indexing backward."""
    model = _tiny()
    exp = ragged_batch(model.config.vocab_size)
    lp, _ = response_log_probs(model, exp, layout=layout)
    assert pack_layout(model, exp, layout) is not None
    nodes = _backward_nodes(lp.sum().grad_fn)
    assert "IndexBackward0" not in nodes, sorted(nodes)
    assert "IndexSelectBackward0" in nodes


def test_take_equals_indexing_in_value_and_gradient():
    """``packing.take`` against plain float64 indexing: the same values, and the gradient of a
    repeated index is the sum of its reads."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    index = torch.tensor([[0, 2, 2], [6, 0, 0]])
    w = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=g)
    (packing.take(x, index, 1) * w).sum().backward()
    got = x.grad.clone()
    x.grad = None
    (x[:, index] * w).sum().backward()
    assert torch.equal(packing.take(x, index, 1), x[:, index])
    torch.testing.assert_close(got, x.grad, atol=1e-12, rtol=0)
