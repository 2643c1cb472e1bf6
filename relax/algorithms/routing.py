"""Mixture-of-experts routing as pure tensor functions: the top-k choice, the gate weights of a
given (recorded) choice, the router's load-balancing loss and its metrics.

Conventions: ``logits`` [N, E] are one layer's router logits for N tokens over E experts;
``indices`` [N, k] the chosen experts. The top-k router is Qwen3-MoE's (transformers'
``Qwen3MoeTopKRouter``): a softmax over all E logits in float32, the k largest probabilities,
renormalized to sum 1 when ``normalize`` (the config's ``norm_topk_prob``), cast back to the
logits' dtype.

Replay (docs/algorithms/moe.md, "Routing replay"): :func:`replayed_gate_weights` keeps the
experts of a record and recomputes their weights from the current router's logits exactly as
the router weighs its own choice -- the full softmax's probabilities at the recorded experts,
renormalized over them when ``normalize``. With ``normalize`` that is the softmax over the
recorded experts' logits, the published R3 gate (Ma et al., arXiv 2510.11370, Eq. 6); when the
record equals the router's own choice the weights are the router's own, bit for bit.
"""

from __future__ import annotations

import torch


def _weights(probs: torch.Tensor, normalize: bool, dtype: torch.dtype) -> torch.Tensor:
    if normalize:
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs.to(dtype)


def top_k_route(logits: torch.Tensor, k: int, normalize: bool):
    """``(weights [N, k] in the logits' dtype, indices [N, k])`` of the router's own choice."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    top, indices = torch.topk(probs, k, dim=-1)
    return _weights(top, normalize, logits.dtype), indices


def replayed_gate_weights(logits: torch.Tensor, indices: torch.Tensor,
                          normalize: bool) -> torch.Tensor:
    """[N, k] gate weights of the recorded experts ``indices`` [N, k] under the current router
    ``logits`` [N, E] (differentiable in the logits; the choice itself is not)."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float)
    return _weights(probs.gather(-1, indices), normalize, logits.dtype)


def expert_counts(indices: torch.Tensor, num_experts: int,
                  weight: torch.Tensor | None = None) -> torch.Tensor:
    """[E] float64 assignments per expert of ``indices`` [N, k] (each token counted once per
    expert it uses), tokens weighted by ``weight`` [N] (1 when None; 0 drops padding)."""
    w = torch.ones(indices.shape[0], dtype=torch.float64, device=indices.device) \
        if weight is None else weight.to(torch.float64)
    return torch.zeros(num_experts, dtype=torch.float64, device=indices.device).index_add_(
        0, indices.reshape(-1), w.repeat_interleave(indices.shape[1]))


def load_balancing_loss(logits: torch.Tensor, indices: torch.Tensor, num_experts: int,
                        weight: torch.Tensor) -> torch.Tensor:
    """Switch-Transformer auxiliary loss of one layer (Fedus et al. 2021, Eq. 4-6) as
    Megatron-LM's ``switch_load_balancing_loss_func`` normalizes it (``--moe-aux-loss-coef``):
    ``(E / k) * sum_e f_e * P_e`` with ``f_e`` the share of the weighted tokens routed to
    expert e (the shares sum to k), ``P_e`` the router's mean probability of e; 1 when the
    load and the probabilities are uniform. (transformers' ``load_balancing_loss_func`` is k
    times this for one layer.) ``weight`` [N]: 1 on real tokens, 0 on padding. A float32
    scalar; its gradient reaches the logits through ``P`` only (the choice is discrete)."""
    probs = torch.softmax(logits.float(), dim=-1)
    w = weight.to(probs.dtype)
    total = w.sum().clamp(min=1)
    k = indices.shape[1]
    f = torch.zeros(num_experts, dtype=probs.dtype, device=probs.device).index_add_(
        0, indices.reshape(-1), w.repeat_interleave(k)) / total
    p = (probs * w[:, None]).sum(0) / total
    return (num_experts / k) * (f * p).sum()


def router_entropy(logits: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean entropy (nats) of the router's softmax over the tokens weighted by ``weight`` [N]."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    w = weight.to(ent.dtype)
    return (ent * w).sum() / w.sum().clamp(min=1)
