"""Mixture-of-experts routing math (relax/algorithms/routing.py) against references written
here in float64 loops: the top-k router (and transformers' own), replayed gate weights, the
load-balancing loss, expert counts and the router entropy."""

import math

import pytest
import torch

from relax.algorithms.routing import (
    expert_counts,
    load_balancing_loss,
    replayed_gate_weights,
    router_entropy,
    top_k_route,
)

N, E, K = 13, 5, 2


def _logits(seed=0, dtype=torch.float64):
    return torch.randn(N, E, generator=torch.Generator().manual_seed(seed), dtype=dtype) * 2


def _softmax_row(row):
    z = [math.exp(v - max(row)) for v in row]
    return [v / sum(z) for v in z]


@pytest.mark.parametrize("normalize", [True, False])
def test_top_k_route_and_replay_against_a_loop(normalize):
    logits = _logits()
    weights, idx = top_k_route(logits, K, normalize)
    for i, row in enumerate(logits.tolist()):
        p = _softmax_row(row)
        best = sorted(range(E), key=lambda e: -p[e])[:K]
        assert idx[i].tolist() == best
        want = [p[e] for e in best]
        if normalize:
            want = [v / sum(want) for v in want]
        torch.testing.assert_close(weights[i], torch.tensor(want, dtype=torch.float64),
                                   atol=1e-6, rtol=1e-6)  # the router's softmax is float32
    # replaying the router's own choice gives its own weights, bit for bit
    assert torch.equal(replayed_gate_weights(logits, idx, normalize), weights)
    # another choice: R3's softmax over the recorded experts' logits (normalized), or the full
    # softmax's probabilities at them
    other = torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(i))[:K]
                         for i in range(N)])
    got = replayed_gate_weights(logits, other, normalize)
    for i, row in enumerate(logits.tolist()):
        if normalize:
            sel = [row[e] for e in other[i].tolist()]
            want = _softmax_row(sel)
        else:
            want = [_softmax_row(row)[e] for e in other[i].tolist()]
        torch.testing.assert_close(got[i], torch.tensor(want, dtype=torch.float64),
                                   atol=1e-6, rtol=1e-6)


def test_top_k_route_is_the_transformers_router():
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeTopKRouter

    for normalize in (True, False):
        cfg = Qwen3MoeConfig(hidden_size=8, num_experts=E, num_experts_per_tok=K,
                             norm_topk_prob=normalize)
        router = Qwen3MoeTopKRouter(cfg)
        torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(3))
        h = torch.randn(N, 8, generator=torch.Generator().manual_seed(4))
        logits, weights, idx = router(h)
        ours_w, ours_i = top_k_route(logits, K, normalize)
        assert torch.equal(ours_i, idx) and torch.equal(ours_w, weights)


def test_load_balancing_loss_counts_and_entropy_against_loops():
    logits = _logits(1).requires_grad_(True)
    _, idx = top_k_route(logits.detach(), K, True)
    weight = torch.ones(N, dtype=torch.float64)
    weight[[2, 7]] = 0.0  # padding
    got = load_balancing_loss(logits, idx, E, weight)
    real = [i for i in range(N) if weight[i]]
    probs = [_softmax_row(r) for r in logits.detach().tolist()]
    f = [sum(1 for i in real if e in idx[i].tolist()) / len(real) for e in range(E)]
    p = [sum(probs[i][e] for i in real) / len(real) for e in range(E)]
    want = E / K * sum(a * b for a, b in zip(f, p, strict=True))
    assert got.item() == pytest.approx(want, rel=1e-6)
    assert sum(f) == pytest.approx(K)
    got.backward()  # the gradient reaches the logits (through P), not padding
    assert logits.grad[real].abs().sum() > 0 and logits.grad[[2, 7]].abs().sum() == 0
    counts = expert_counts(idx, E, weight)
    assert counts.tolist() == [sum(1 for i in real if e in idx[i].tolist()) for e in range(E)]
    ent = router_entropy(logits.detach(), weight)
    want_ent = sum(-sum(q * math.log(q) for q in probs[i]) for i in real) / len(real)
    assert ent.item() == pytest.approx(want_ent, rel=1e-12)


def test_a_uniform_router_with_a_balanced_load_scores_one():
    logits = torch.zeros(4, 4)
    idx = torch.tensor([[0, 1], [2, 3], [0, 1], [2, 3]])
    assert load_balancing_loss(logits, idx, 4, torch.ones(4)).item() == pytest.approx(1.0)
    # every token on experts 0 and 1: f = (1, 1, 0, 0), P uniform -> 2 * (1/4 + 1/4) = 1; a
    # router that also prefers them scores more
    skew = torch.tensor([[2.0, 2.0, 0.0, 0.0]]).repeat(4, 1)
    same = torch.tensor([[0, 1]] * 4)
    assert load_balancing_loss(skew, same, 4, torch.ones(4)).item() > 1.5
