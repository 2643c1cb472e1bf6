"""Per-token policy losses and their reductions (SPEC section 7).

Three separate pieces, tested separately (STYLE principle 3):

* per-token losses: :func:`ppo_clip_loss`, :func:`gspo_loss`, :func:`sapo_loss`, each
  ``[B, T] -> [B, T]``, 0 outside the mask;
* reductions: :func:`response_mean` (the formal objective of every estimator) and
  :func:`token_mean` (``--calculate-per-token-loss``, group-relative family only);
* the distributed denominator: ``num_responses`` / ``num_tokens`` are passed in by the
  caller (the optimizer step's global count), so summing the per-micro-batch, per-rank
  values gives the whole-batch objective and the same gradient.

Every input is sanitized with a boolean select before any arithmetic, so NaN or Inf stored
at masked positions of log-probs or advantages reaches neither the loss nor the gradient
that flows back into ``log_probs``. Nothing here reads a value back to the host.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax.algorithms._checks import as_bool_mask, check_like_mask, compute_dtype, masked_select


def _sanitized(log_probs, old_log_probs, advantages, mask):
    m = as_bool_mask(mask)
    check_like_mask(log_probs, m, "log_probs")
    check_like_mask(old_log_probs, m, "old_log_probs")
    check_like_mask(advantages, m, "advantages")
    dtype = compute_dtype(log_probs, old_log_probs, advantages)
    return (
        m,
        masked_select(log_probs, m, dtype),
        masked_select(old_log_probs.detach(), m, dtype),
        masked_select(advantages.detach(), m, dtype),
    )


def _clip(ratio: Tensor, adv: Tensor, m: Tensor, eps_clip: float, eps_clip_high, eps_clip_c):
    """``max(-ratio*A, -clip(ratio, 1-eps_low, 1+eps_high)*A)``, optional dual clip."""
    eps_high = eps_clip if eps_clip_high is None else eps_clip_high
    unclipped = -adv * ratio
    clipped_obj = -adv * ratio.clamp(1.0 - eps_clip, 1.0 + eps_high)
    pg = torch.maximum(unclipped, clipped_obj)
    clipped = clipped_obj > unclipped
    if eps_clip_c is not None:
        if not eps_clip_c > 1.0:
            raise ValueError(f"eps_clip_c={eps_clip_c!r} must be > 1 (dual clip)")
        # Dual clip (for A < 0 only): bound the loss by -c * A.
        dual = -eps_clip_c * adv
        dual_active = (adv < 0) & (dual < pg)
        pg = torch.where(dual_active, dual, pg)
        clipped = clipped | dual_active
    zero = torch.zeros((), dtype=pg.dtype, device=pg.device)
    return torch.where(m, pg, zero), clipped & m


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

    Args are all [B, T]. Returns ``(pg [B, T], clipped [B, T] bool)``; ``clipped`` marks the
    valid tokens where a clipped branch (either bound or the dual clip) sets the value.
    """
    m, lp, old, adv = _sanitized(log_probs, old_log_probs, advantages, mask)
    ratio = torch.exp(lp - old)
    return _clip(ratio, adv, m, eps_clip, eps_clip_high, eps_clip_c)


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
) -> tuple[Tensor, Tensor]:
    """GSPO: the sequence ratio ``s_i = exp(mean_t over valid tokens (log_probs - old))``
    replaces ``rho`` on every valid token of response ``i``, then the PPO clip (SPEC 7).

    A fully masked response has ``s_i = 1`` and contributes 0. Returns ``(pg, clipped)``.
    """
    m, lp, old, adv = _sanitized(log_probs, old_log_probs, advantages, mask)
    length = m.sum(dim=1, keepdim=True).clamp(min=1).to(lp.dtype)
    seq_ratio = torch.exp((lp - old).sum(dim=1, keepdim=True) / length)  # [B, 1]
    return _clip(seq_ratio.expand_as(lp), adv, m, eps_clip, eps_clip_high, None)


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
    with ``tau = tau_pos`` where ``A > 0`` else ``tau_neg`` (SPEC 7). Returns ``pg`` [B, T]."""
    m, lp, old, adv = _sanitized(log_probs, old_log_probs, advantages, mask)
    ratio = torch.exp(lp - old)
    # Taus built in the compute dtype: a float32 1.05 would bias float64 results.
    tau = torch.where(
        adv > 0,
        torch.tensor(tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.tensor(tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gate = 4.0 * torch.sigmoid(tau * (ratio - 1.0)) / tau
    pg = -gate * adv
    return torch.where(m, pg, torch.zeros((), dtype=pg.dtype, device=pg.device))


def response_mean(values: Tensor, mask: Tensor, *, num_responses: int | Tensor | None = None) -> Tensor:
    """``(1/B) * sum_i (1/L_i) * sum_t m[i,t] * values[i,t]`` (SPEC 7), a scalar.

    ``num_responses`` = B of the optimizer step's *global* batch (all micro-batches, all
    ranks) so per-micro-batch values add up to the objective; defaults to this batch's
    rows. Responses with ``L_i = 0`` add 0 but still count in B.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    v = masked_select(values, m, compute_dtype(values))
    length = m.sum(dim=1).clamp(min=1).to(v.dtype)
    per_response = v.sum(dim=1) / length
    denom = m.shape[0] if num_responses is None else num_responses
    return per_response.sum() / denom


def token_mean(values: Tensor, mask: Tensor, *, num_tokens: int | Tensor | None = None) -> Tensor:
    """``sum_S values / N`` over valid tokens, a scalar. ``num_tokens`` = the optimizer
    step's global valid-token count (default: this batch's count, at least 1)."""
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    v = masked_select(values, m, compute_dtype(values))
    denom = m.sum().clamp(min=1).to(v.dtype) if num_tokens is None else num_tokens
    return v.sum() / denom
