"""Per-token policy losses and their reductions (reinforce_plus_plus.md §7).

Three separate pieces, tested separately:

* per-token losses: :func:`ppo_clip_loss`, :func:`gspo_loss`, :func:`sapo_loss`,
  :func:`cispo_loss`, :func:`rloo_loss`, each ``[B, T] -> [B, T]``, 0 outside the mask;
* reductions: :func:`response_mean` (the default objective) and :func:`token_mean`
  (``--calculate-per-token-loss``: optional for grpo/gspo/sapo, the objective of rloo and
  cispo, reinforce_plus_plus.md §5a, §5b);
* the distributed denominator: ``num_responses`` / ``num_tokens`` are passed in by the caller
  (the optimizer step's global count), so summing the per-micro-batch, per-rank values gives
  the whole-batch objective and its gradient.

Masking (reinforce_plus_plus.md §1): every loss first selects its inputs with the mask (0 at
masked positions), computes on those finite values and selects its result again. Selecting
only the result would not do: the backward of ``exp`` or a product at a NaN input gives
``0 * NaN``. So NaN or Inf stored at masked positions reaches neither a loss nor a gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax.algorithms._checks import as_bool_mask, check_like_mask, compute_dtype


def _masked_inputs(log_probs, old_log_probs, advantages, mask):
    """``(m, lp, old, adv)``: checked, in the compute dtype, 0 at masked positions; the old
    log-probs and advantages are constants of the loss (detached)."""
    m = as_bool_mask(mask)
    check_like_mask(log_probs, m, "log_probs")
    check_like_mask(old_log_probs, m, "old_log_probs")
    check_like_mask(advantages, m, "advantages")
    dtype = compute_dtype(log_probs, old_log_probs, advantages)
    lp = torch.where(m, log_probs.to(dtype), 0.0)
    old, adv = (torch.where(m, x.detach().to(dtype), 0.0) for x in (old_log_probs, advantages))
    return m, lp, old, adv


def _clip(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float) -> tuple[Tensor, Tensor]:
    """``(max(-A*ratio, -A*clip(ratio, 1 - eps_low, 1 + eps_high)), clipped)``; ``clipped``
    marks where the clipped branch is strictly larger (its value is constant in the ratio)."""
    unclipped = -adv * ratio
    bounded = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    return torch.maximum(unclipped, bounded), bounded > unclipped


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped surrogate per token (GRPO and both REINFORCE++ variants).

        rho = exp(log_probs - old_log_probs)                        (no clamp)
        pg  = max(-rho*A, -clip(rho, 1 - eps_clip, 1 + eps_clip_high)*A)
        A < 0 and eps_clip_c = c > 1:  pg = min(pg, -c*A)

    Args are all ``[B, T]``. Returns ``(pg [B, T], clipped [B, T] bool)``; ``clipped`` marks the
    valid tokens where a clipped branch (either bound or the dual clip) sets the value. The
    gradient flows into ``log_probs`` only.
    """
    if eps_clip_c is not None and not eps_clip_c > 1.0:
        raise ValueError(f"eps_clip_c={eps_clip_c!r} must be > 1 (dual clip)")
    m, lp, old, adv = _masked_inputs(log_probs, old_log_probs, advantages, mask)
    high = eps_clip if eps_clip_high is None else eps_clip_high
    pg, clipped = _clip(torch.exp(lp - old), adv, eps_clip, high)
    if eps_clip_c is not None:
        dual = (adv < 0) & (-eps_clip_c * adv < pg)
        pg = torch.where(dual, -eps_clip_c * adv, pg)
        clipped = clipped | dual
    return torch.where(m, pg, 0.0), clipped & m


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """GSPO: the sequence ratio ``s_i = exp(mean over valid t of (log_probs - old))`` replaces
    ``rho`` on every valid token of response ``i``, then the PPO clip (reinforce_plus_plus.md §7).

    A fully masked response has ``s_i = 1`` and contributes 0. Returns ``(pg, clipped)``, both
    ``[B, T]``.
    """
    m, lp, old, adv = _masked_inputs(log_probs, old_log_probs, advantages, mask)
    length = m.sum(dim=1, keepdim=True).clamp(min=1).to(lp.dtype)
    seq_ratio = torch.exp((lp - old).sum(dim=1, keepdim=True) / length)  # [B, 1]
    high = eps_clip if eps_clip_high is None else eps_clip_high
    pg, clipped = _clip(seq_ratio, adv, eps_clip, high)
    return torch.where(m, pg, 0.0), clipped & m


def sapo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> Tensor:
    """SAPO soft gate per token: ``pg = -f(rho) * A``, ``f(rho) = 4 sigmoid(tau (rho - 1)) / tau``
    with ``tau = tau_pos`` where ``A > 0`` else ``tau_neg`` (reinforce_plus_plus.md §7).

    Returns ``pg`` ``[B, T]``. The taus are made in the compute dtype (a float32 1.05 would bias
    float64 results)."""
    m, lp, old, adv = _masked_inputs(log_probs, old_log_probs, advantages, mask)
    rho = torch.exp(lp - old)
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=lp.dtype, device=lp.device),
                      torch.tensor(tau_neg, dtype=lp.dtype, device=lp.device))
    pg = -(4.0 * torch.sigmoid(tau * (rho - 1.0)) / tau) * adv
    return torch.where(m, pg, 0.0)


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """CISPO per token: a capped, detached importance weight times the REINFORCE term
    (reinforce_plus_plus.md §5b).

        rho = exp(log_probs - old_log_probs)                         (no clamp)
        w   = min(rho, 1 + eps_clip_high)   where A >= 0
              max(rho, 1 - eps_clip)        where A <  0
        pg  = -sg(w) * A * log_probs

    The bound sits where the PPO clip would zero a token's gradient; here the token keeps it,
    scaled by the bound. Args ``[B, T]``; returns ``(pg [B, T], clipped [B, T] bool)``,
    ``clipped`` marking the valid tokens whose weight the bound set. The gradient flows into
    ``log_probs`` only, through the log-prob factor: ``d pg / d log_probs = -w * A``.
    """
    m, lp, old, adv = _masked_inputs(log_probs, old_log_probs, advantages, mask)
    high = eps_clip if eps_clip_high is None else eps_clip_high
    rho = torch.exp(lp.detach() - old)
    positive = adv >= 0
    w = torch.where(positive, rho.clamp(max=1.0 + high), rho.clamp(min=1.0 - eps_clip))
    clipped = torch.where(positive, rho > 1.0 + high, rho < 1.0 - eps_clip)
    return torch.where(m, -w * adv * lp, 0.0), clipped & m


def rloo_loss(log_probs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """RLOO's unclipped REINFORCE term per token, ``pg = -sg(A) * log_probs``
    (reinforce_plus_plus.md §5a): no importance ratio, so it is only the policy gradient on
    tokens the current policy sampled (the configuration enforces one optimizer step per
    rollout). Args ``[B, T]``; returns ``pg`` ``[B, T]``."""
    m = as_bool_mask(mask)
    check_like_mask(log_probs, m, "log_probs")
    check_like_mask(advantages, m, "advantages")
    dtype = compute_dtype(log_probs, advantages)
    lp = torch.where(m, log_probs.to(dtype), 0.0)
    adv = torch.where(m, advantages.detach().to(dtype), 0.0)
    return torch.where(m, -adv * lp, 0.0)


def _masked_values(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    return m, torch.where(m, values.to(compute_dtype(values)), 0.0)


def response_mean(values: Tensor, mask: Tensor, *, num_responses: int | Tensor | None = None) -> Tensor:
    """``(1/B) * sum_i (1/L_i) * sum_t m[i,t] * values[i,t]`` (reinforce_plus_plus.md §7), a scalar.

    ``num_responses`` = B of the optimizer step's *global* batch (all micro-batches, all ranks)
    so per-micro-batch values add up to the objective; defaults to this batch's rows. Responses
    with ``L_i = 0`` add 0 but still count in B.
    """
    m, v = _masked_values(values, mask)
    length = m.sum(dim=1).clamp(min=1).to(v.dtype)
    denom = m.shape[0] if num_responses is None else num_responses
    return (v.sum(dim=1) / length).sum() / denom


def token_mean(values: Tensor, mask: Tensor, *, num_tokens: int | Tensor | None = None) -> Tensor:
    """``sum over valid tokens of values / N``, a scalar. ``num_tokens`` = the optimizer step's
    global valid-token count (default: this batch's count, at least 1)."""
    m, v = _masked_values(values, mask)
    denom = m.sum().clamp(min=1).to(v.dtype) if num_tokens is None else num_tokens
    return v.sum() / denom
