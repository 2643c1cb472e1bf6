"""Log-probs without full logits and the --bf16 path: the chunked output layer equals an
independent float64 log-softmax (values and gradients), the model-level chunked path equals
the full-logits path in fp32 and bf16, and bf16 training stays close to fp32."""

from __future__ import annotations

import copy

import pytest
import torch

from relax.tiny_model import build_tiny_model, build_tokenizer
from relax.trainer.policy import logprobs
from relax.trainer.policy.logprobs import chunked_token_log_probs, response_log_probs
from relax.trainer.policy.update import micro_batch_loss
from tests.trainer.workers import B, fixed_experience, loss_settings_of


def reference(hidden, weight, bias, targets, temperature):
    """float64 log-softmax at the targets and entropy, written out without the production code."""
    h, w = hidden.double(), weight.double()
    logits = h @ w.T + (0 if bias is None else bias.double())
    logits = logits / temperature
    logp_all = logits - logits.logsumexp(-1, keepdim=True)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("rows_per_chunk", [1, 3, 64])
def test_chunks_equal_a_float64_log_softmax_with_gradients(bias, rows_per_chunk):
    g = torch.Generator().manual_seed(0)
    N, H, V, temperature = 10, 8, 37, 0.7
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g, requires_grad=True)
    b = torch.randn(V, generator=g, requires_grad=True) if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    ch = torch.randn(N, generator=g)  # arbitrary upstream gradients
    ce = torch.randn(N, generator=g)
    logp, entropy = chunked_token_log_probs(hidden, weight, b, targets, temperature=temperature,
                                            with_entropy=True, chunk_elements=rows_per_chunk * V)
    assert logp.dtype == torch.float32 and logp.shape == (N,)
    ((logp * ch).sum() + (entropy * ce).sum()).backward()
    leaves = [hidden, weight] + ([b] if bias else [])
    got = [x.grad.clone() for x in leaves]
    for x in leaves:
        x.grad = None
    ref_logp, ref_entropy = reference(hidden, weight, b, targets, temperature)
    ((ref_logp * ch.double()).sum() + (ref_entropy * ce.double()).sum()).backward()
    torch.testing.assert_close(logp.double(), ref_logp.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy.double(), ref_entropy.detach(), atol=1e-5, rtol=0)
    for a, x in zip(got, leaves, strict=True):
        torch.testing.assert_close(a.double(), x.grad.double(), atol=1e-4, rtol=1e-4)


def test_entropy_without_grad_and_no_grad_mode():
    hidden = torch.randn(6, 4, requires_grad=True)
    weight = torch.randn(9, 4, requires_grad=True)
    targets = torch.randint(0, 9, (6,))
    logp, entropy = chunked_token_log_probs(hidden, weight, None, targets, with_entropy=True,
                                            entropy_grad=False, chunk_elements=18)
    assert logp.requires_grad and not entropy.requires_grad
    with torch.no_grad():
        again, none = chunked_token_log_probs(hidden, weight, None, targets, chunk_elements=18)
    assert none is None and not again.requires_grad
    torch.testing.assert_close(again, logp.detach())


@pytest.fixture(scope="module")
def model():
    return build_tiny_model(build_tokenizer(), seed=5)


def _full_path(monkeypatch):
    monkeypatch.setattr(logprobs, "_output_layer", lambda inner: None)


@pytest.mark.parametrize("bf16, atol", [(False, 2e-5), (True, 2e-3)])
def test_model_chunked_path_equals_the_full_logits_path(model, monkeypatch, bf16, atol):
    """Same log-probs, entropy and parameter gradients as the model's own head, with the
    chunk small enough that a micro-batch spans several chunks."""
    exp = fixed_experience(model)
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 5 * model.config.vocab_size)
    results = []
    for full in (False, True):
        if full:
            _full_path(monkeypatch)
        model.zero_grad(set_to_none=True)
        logp, ent = response_log_probs(model, exp, temperature=0.9, with_entropy=True, bf16=bf16)
        (logp.sum() + 0.5 * ent.sum()).backward()
        results.append((logp.detach(), ent.detach(),
                        [p.grad.clone() for p in model.parameters()]))
    (lp_a, en_a, gr_a), (lp_b, en_b, gr_b) = results
    assert lp_a.dtype == torch.float32
    torch.testing.assert_close(lp_a, lp_b, atol=atol, rtol=0)
    torch.testing.assert_close(en_a, en_b, atol=atol, rtol=0)
    for a, b in zip(gr_a, gr_b, strict=True):
        torch.testing.assert_close(a, b, atol=atol * 10, rtol=1e-2 if bf16 else 1e-4)
    # the head is put back: a plain forward still gives logits over the vocabulary
    out = model(input_ids=exp.input_ids[:1, :4]).logits
    assert out.shape[-1] == model.config.vocab_size


def test_bf16_gradient_is_close_to_fp32(model):
    """One micro-batch loss (GRPO clip, k3 KL loss) under bf16 autocast against fp32: bf16
    keeps 8 mantissa bits (relative rounding 2^-9 per operation), accumulated over a few
    dozen operations per token, so the gradient agrees in direction (cosine > 0.99) and in
    norm within 5%, not bitwise; the fp32 master weights are never bf16."""
    exp = fixed_experience(model)
    g = torch.Generator().manual_seed(1)
    exp.advantages = torch.randn(exp.response_mask.shape, generator=g) * exp.response_mask
    exp.ref_log_probs = logprobs.batched_log_probs(model, exp, micro_batch_size=B,
                                                   temperature=1.0) - 0.05
    grads = []
    for bf16 in (False, True):
        s = loss_settings_of(advantage_estimator="grpo", use_kl_loss=True, kl_loss_type="k3",
                         kl_loss_coef=0.1, bf16=bf16)
        model.zero_grad(set_to_none=True)
        loss, _ = micro_batch_loss(model, copy.copy(exp), s, num_responses=B, num_tokens=None)
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert all(p.dtype == torch.float32 for p in model.parameters())
    fp32, bf16 = grads
    cosine = torch.nn.functional.cosine_similarity(fp32, bf16, dim=0)
    assert cosine > 0.99, cosine
    assert abs(bf16.norm() / fp32.norm() - 1) < 0.05


def test_head_weight_cast_once_changes_no_bit(model, monkeypatch):
    """Under bf16 autocast the output layer's weight is cast once for all chunks (not again in
    each chunk's recompute): log-probs, entropy and every parameter gradient are bitwise those
    of letting autocast cast it per chunk, over several chunks."""
    exp = fixed_experience(model)
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", 5 * model.config.vocab_size)
    results = []
    for per_chunk in (False, True):
        if per_chunk:
            monkeypatch.setattr(logprobs, "_autocast_weight", lambda weight, device_type: weight)
        model.zero_grad(set_to_none=True)
        logp, ent = response_log_probs(model, exp, temperature=0.9, with_entropy=True, bf16=True)
        (logp.sum() + 0.5 * ent.sum()).backward()
        results.append([logp.detach(), ent.detach(), *(p.grad.clone() for p in model.parameters())])
    assert int(exp.response_mask.sum()) > 10  # several chunks of 5 rows
    for once, per_chunk in zip(*results, strict=True):
        assert torch.equal(once, per_chunk)
