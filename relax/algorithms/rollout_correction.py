"""Rollout correction: importance weights and rejection masks between the sampler and the
trainer (reinforce_plus_plus.md §7c), one family behind two tables.

``d[i,t] = q[i,t] - s[i,t]`` is the log of the per-token ratio ``r = pi_old / pi_sampler``
(``q`` the trainer's pi_old, ``s`` the sampler's log-prob, as §7a). Every statistic is formed
in log space, so a sequence's product of ratios never overflows or underflows before it is
bounded; every function reads only the positions of ``mask`` (values outside, NaN included,
never reach a result) and returns float32 (float64 for float64 inputs). Weights and masks
are constants of the loss.

- :data:`IS_LEVELS` (``--rollout-is``): the log-weight of each token: its own ``d``
  (``token``), its row's sum (``sequence``: the product of the ratios) or mean
  (``geometric``: their geometric mean). :data:`IS_MODES` (``--rollout-is-mode``) bounds it
  to ``[low, high]``: ``truncate`` clamps, ``mask`` sets the weight to 0 outside.
- :data:`REJECTIONS` (``--rollout-rs``): a statistic per token and which bound it must keep:
  ``token`` (IcePop: each token's ratio in ``[low, high]``), ``sequence`` / ``geometric``
  (the row's product / geometric mean in ``[low, high]``), ``k3`` (the row's mean K3 at most
  ``high``). A row-level statistic drops the whole row.
- :func:`veto_keep` (``--rollout-token-veto-threshold``): a row is dropped when any of its
  tokens has a ratio below the threshold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from relax.algorithms.sampler_mismatch import log_ratio


def _row_sum(d: Tensor, mask: Tensor) -> Tensor:
    """[B, 1]: the row's sum of ``d`` over its masked tokens (0 without tokens)."""
    return torch.where(mask, d, torch.zeros_like(d)).sum(-1, keepdim=True)


def _row_mean(d: Tensor, mask: Tensor) -> Tensor:
    """[B, 1]: the row's mean of ``d`` over its masked tokens (0 without tokens)."""
    return _row_sum(d, mask) / mask.sum(-1, keepdim=True).clamp(min=1).to(d.dtype)


def token_statistic(d: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: each token's log-ratio."""
    return d


def sequence_statistic(d: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: the log of the row's product of ratios, on each of its tokens."""
    return _row_sum(d, mask).expand_as(d)


def geometric_statistic(d: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: the log of the row's geometric-mean ratio, on each of its tokens."""
    return _row_mean(d, mask).expand_as(d)


def k3_statistic(d: Tensor, mask: Tensor) -> Tensor:
    """[B, T]: the row's mean K3 estimate ``e^d - 1 - d`` of KL(pi_sampler || pi_old)."""
    return _row_mean(torch.expm1(d) - d, mask).expand_as(d)


IS_LEVELS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "token": token_statistic,
    "sequence": sequence_statistic,
    "geometric": geometric_statistic,
}


def _log_bounds(low: float, high: float) -> tuple[float, float]:
    return (math.log(low) if low > 0 else -math.inf), math.log(high)


def truncated(log_w: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """``clamp(e^log_w, low, high)`` and where the clamp acted (both [B, T])."""
    lo, hi = _log_bounds(low, high)
    return torch.exp(log_w.clamp(min=lo, max=hi)), (log_w < lo) | (log_w > hi)


def masked(log_w: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """``e^log_w`` inside ``[low, high]``, 0 outside, and where it is outside (both [B, T])."""
    lo, hi = _log_bounds(low, high)
    outside = (log_w < lo) | (log_w > hi)
    inside = torch.exp(log_w.clamp(max=hi))  # never inf, even where it is dropped
    return torch.where(outside, torch.zeros_like(inside), inside), outside


IS_MODES: dict[str, Callable[[Tensor, float, float], tuple[Tensor, Tensor]]] = {
    "truncate": truncated,
    "mask": masked,
}


def importance_weights(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor, *,
                       level: str, mode: str, low: float, high: float
                       ) -> tuple[Tensor, Tensor]:
    """Rollout importance weights [B, T] (0 outside ``mask``) and the tokens whose weight the
    bounds changed ([B, T] bool, False outside ``mask``): ``IS_MODES[mode]`` of
    ``IS_LEVELS[level]`` of the log-ratios, bounded to ``[low, high]`` (``low`` 0: none)."""
    d = log_ratio(trainer_log_probs, sampler_log_probs, mask)
    w, outside = IS_MODES[mode](IS_LEVELS[level](d, mask), low, high)
    return torch.where(mask, w, torch.zeros_like(w)), outside & mask


@dataclass(frozen=True)
class Rejection:
    """A rejection rule: its per-token ``statistic`` and whether it must lie in ``[low,
    high]`` in log space (``log_bounds``: a ratio) or be at most ``high`` (a divergence)."""

    statistic: Callable[[Tensor, Tensor], Tensor]
    log_bounds: bool = True


REJECTIONS: dict[str, Rejection] = {
    "token": Rejection(token_statistic),  # IcePop
    "sequence": Rejection(sequence_statistic),
    "geometric": Rejection(geometric_statistic),
    "k3": Rejection(k3_statistic, log_bounds=False),
}


def rejection_keep(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor, *,
                   kind: str, low: float, high: float) -> Tensor:
    """[B, T] bool: the tokens ``REJECTIONS[kind]`` keeps (True outside ``mask``). A ratio
    statistic is kept inside ``[low, high]``, a divergence (``k3``) at most ``high``
    (``low`` unused); a row without masked tokens is kept (its statistics are 0)."""
    d = log_ratio(trainer_log_probs, sampler_log_probs, mask)
    rule = REJECTIONS[kind]
    stat = rule.statistic(d, mask)
    if rule.log_bounds:
        lo, hi = _log_bounds(low, high)
        keep = (stat >= lo) & (stat <= hi)
    else:
        keep = stat <= high
    return keep | ~mask


def veto_keep(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor, *,
              threshold: float) -> Tensor:
    """[B] bool: False for a row with a masked token whose ratio is below ``threshold``."""
    d = log_ratio(trainer_log_probs, sampler_log_probs, mask)
    return ~((d < math.log(threshold)) & mask).any(-1)


def weight_sums(w: Tensor, mask: Tensor) -> Tensor:
    """float64 [4]: over the masked tokens, the count, ``sum w``, ``sum w^2`` and ``max w``
    (0 without tokens): what the effective sample size (relax/metrics/tracker.py
    ``add_ess``) and the weights' maximum need, summed (the first three) or maxed (the last)
    over micro-batches and ranks."""
    w64 = torch.where(mask, w.detach().double(), torch.zeros((), dtype=torch.float64,
                                                              device=w.device))
    top = w64.max() if w64.numel() else w64.sum()
    return torch.stack([mask.sum().double(), w64.sum(), (w64 * w64).sum(), top])

