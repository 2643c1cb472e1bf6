"""The sampler against the trainer: mismatch measures, truncated importance weights and the
off-policy sequence mask (reinforce_plus_plus.md §7a).

The sampler's log-prob ``s[i,t]`` is the one the decode drew token ``t`` with (after the
temperature, before top-p/top-k truncation: relax/rollout/generation/generate.py); the trainer's
``q[i,t]`` is pi_old of the same token computed by the training forward. ``d = q - s`` is the
log of the ratio ``r = pi_trainer / pi_sampler``. Every function reads only the positions of
``mask`` (values outside may be anything, NaN included) and returns float32 (float64 for
float64 inputs); weights and masks are constants of the loss (no gradient flows through them).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LOG_TWO = math.log(2.0)


def log_ratio(numerator: Tensor, denominator: Tensor, mask: Tensor) -> Tensor:
    """``numerator - denominator`` on ``mask``, 0 elsewhere (NaN outside never leaks)."""
    dtype = torch.float64 if numerator.dtype == torch.float64 else torch.float32
    d = numerator.detach().to(dtype) - denominator.detach().to(dtype)
    return torch.where(mask, d, torch.zeros_like(d))


def mismatch_sums(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor
                  ) -> dict[str, Tensor]:
    """Sums over the masked tokens [B, T] of the mismatch measures (scalars):

    ``tokens`` (count), ``abs_diff`` (sum |d|), ``abs_diff_max`` (max |d|, 0 without tokens),
    ``k1`` (sum -d) and ``k3`` (sum e^d - 1 - d): per token the k1 and k3 estimates of
    KL(pi_sampler || pi_trainer) from tokens the sampler drew; ``outside`` (tokens whose ratio
    e^d lies outside [0.5, 2])."""
    d = log_ratio(trainer_log_probs, sampler_log_probs, mask)
    m = mask.to(d.dtype)
    a = d.abs()
    return {
        "tokens": m.sum(),
        "abs_diff": (a * m).sum(),
        "abs_diff_max": a.max() if a.numel() else a.sum(),
        "k1": (-d * m).sum(),
        "k3": ((torch.expm1(d) - d) * m).sum(),
        "outside": ((a > LOG_TWO) & mask).to(d.dtype).sum(),
    }


def tis_weights(trainer_log_probs: Tensor, sampler_log_probs: Tensor, mask: Tensor, *,
                clip: float, clip_low: float = 0.0) -> tuple[Tensor, Tensor]:
    """Truncated importance weights [B, T] ``w = clamp(e^d, clip_low, clip)`` on ``mask`` (0
    elsewhere) and where the clamp acted ([B, T] bool): the token-level correction of a loss
    written for pi_trainer on tokens pi_sampler drew (TIS)."""
    d = log_ratio(trainer_log_probs, sampler_log_probs, mask)
    ratio = torch.exp(d)
    w = ratio.clamp(min=clip_low, max=clip)
    clipped = ((ratio > clip) | (ratio < clip_low)) & mask
    return torch.where(mask, w, torch.zeros_like(w)), clipped


def opsm_keep(log_probs: Tensor, sampler_log_probs: Tensor, advantages: Tensor, mask: Tensor, *,
              delta: float) -> Tensor:
    """Off-policy sequence masking: [B] bool, False for a response whose advantage is negative
    and whose mean over its tokens of ``log pi_sampler - log pi_theta`` exceeds ``delta`` (the
    policy has moved that far from what sampled it; learning from its mistakes would push in a
    direction the data no longer supports). A response without masked tokens is kept."""
    d = log_ratio(sampler_log_probs, log_probs, mask)
    count = mask.sum(-1)
    divergence = d.sum(-1) / count.clamp(min=1)
    negative = (torch.where(mask, advantages.detach(), torch.zeros_like(d)).sum(-1) < 0)
    return ~(negative & (divergence > delta) & (count > 0))
