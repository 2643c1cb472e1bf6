"""Raw returns and advantages of the estimators (reinforce_plus_plus.md §3, 4, 5, 5a).

All functions are pure: tensors in, tensors out, no process group (a prompt group never
straddles data-parallel ranks). Sums are accumulated in float64; outputs are exactly 0
outside the mask, float32 for float32/bf16/fp16 inputs and float64 for float64 inputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax.algorithms._checks import (
    as_bool_mask,
    check_group_index,
    check_like_mask,
    check_per_response,
    compute_dtype,
)


def last_valid_position(mask: Tensor) -> Tensor:
    """``T_i`` (reinforce_plus_plus.md §1): index of the last ``True`` in each row of a bool
    ``[B, T]`` mask, -1 for a fully masked row; int64 ``[B]``."""
    B, T = mask.shape
    if T == 0:
        return torch.full((B,), -1, dtype=torch.long, device=mask.device)
    positions = torch.arange(T, device=mask.device)
    return torch.where(mask, positions, -1).amax(dim=1)


def discounted_reverse_cumsum(r: Tensor, gamma: float) -> Tensor:
    """``G[:, t] = sum_{u >= t} gamma^(u - t) * r[:, u]`` for ``r`` ``[B, T]``.

    gamma = 1 (the default of every recipe) is one cumsum over the reversed rows; otherwise a
    reverse loop over positions, which never forms ``gamma^-t`` (it overflows float32 near
    T = 8192 at gamma = 0.99)."""
    if gamma == 1.0:
        return r.flip(1).cumsum(1).flip(1)
    G = torch.empty_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = r[:, t] + gamma * running
        G[:, t] = running
    return G


def reinforce_plus_plus_returns(
    rewards: Tensor,
    old_log_probs: Tensor | None,
    ref_log_probs: Tensor | None,
    mask: Tensor,
    *,
    kl_coef: float,
    gamma: float = 1.0,
) -> Tensor:
    """REINFORCE++ token returns ``G`` ``[B, T]`` (reinforce_plus_plus.md §3).

        d[i,t] = old_log_probs - ref_log_probs                (signed k1)
        r[i,t] = m * (-kl_coef * d + 1(t = T_i) * rewards[i])
        G[i,t] = m * sum_{u=t}^{T_i} gamma^(u-t) * r[i,u]     (positions, holes included)

    ``rewards`` ``[B]``; ``old_log_probs`` / ``ref_log_probs`` may be ``None`` only when
    ``kl_coef == 0``.
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    if not (0.0 < gamma <= 1.0):
        raise ValueError(f"gamma={gamma!r} must lie in (0, 1]")
    if kl_coef < 0:
        raise ValueError(f"kl_coef={kl_coef!r} must be >= 0")
    if kl_coef != 0:
        if old_log_probs is None or ref_log_probs is None:
            raise ValueError("old_log_probs and ref_log_probs are required when kl_coef != 0")
        check_like_mask(old_log_probs, m, "old_log_probs")
        check_like_mask(ref_log_probs, m, "ref_log_probs")
    dtype = compute_dtype(rewards, old_log_probs, ref_log_probs)
    B, _ = m.shape
    if kl_coef != 0:
        d = old_log_probs.detach().double() - ref_log_probs.detach().double()
        r = torch.where(m, -kl_coef * d, 0.0)  # NaN/Inf at masked positions never selected
    else:
        r = torch.zeros(m.shape, dtype=torch.float64, device=m.device)
    last = last_valid_position(m)
    # The reward lands on T_i; a fully masked row keeps zeros (its reward is never read).
    terminal = torch.where(last >= 0, rewards.detach().double(), 0.0)
    r[torch.arange(B, device=m.device), last.clamp(min=0)] += terminal
    return torch.where(m, discounted_reverse_cumsum(r, gamma), 0.0).to(dtype)


def reinforce_plus_plus_baseline_advantages(
    rewards: Tensor, group_index: Tensor, mask: Tensor
) -> Tensor:
    """REINFORCE++-baseline raw advantage ``A_raw`` ``[B, T]`` (reinforce_plus_plus.md §4).

        b_g = mean_{j in g} rewards[j]       (inclusive; fully masked members count)
        A_raw[i,t] = m * (rewards[i] - b_g)  (never divided by a std)
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    check_group_index(group_index, m)
    mean, _ = group_mean_std(rewards, group_index)
    return broadcast_masked(rewards.double() - mean, m, compute_dtype(rewards))


def group_relative_advantages(
    rewards: Tensor, group_index: Tensor, mask: Tensor, *, std_normalization: bool = True
) -> Tensor:
    """GRPO-family advantage ``[B, T]`` (reinforce_plus_plus.md §5), broadcast to valid tokens.

        A_i = rewards[i] - mean_g(rewards)
        A_i = A_i / (std_g(rewards) + 1e-6)   if std_normalization (ddof = 1; one member: std 0)
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    check_group_index(group_index, m)
    mean, std = group_mean_std(rewards, group_index)
    adv = rewards.double() - mean
    if std_normalization:
        adv = adv / (std + 1e-6)
    return broadcast_masked(adv, m, compute_dtype(rewards))


def rloo_advantages(rewards: Tensor, group_index: Tensor, mask: Tensor) -> Tensor:
    """RLOO leave-one-out advantage ``[B, T]`` (reinforce_plus_plus.md §5a), on valid tokens.

        b_i = (sum_{j in g, j != i} rewards[j]) / (n_g - 1)   (every other member of the group)
        A_i = rewards[i] - b_i                                (never divided by a std)

    A group of one has no other member to form a baseline: its ``A`` is 0 (the configuration
    requires two samples per prompt, so only a hand-built batch has one). Rewards must be
    finite (the scorer guarantees it): a non-finite reward would reach every member of its
    group through the baseline.
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    check_group_index(group_index, m)
    r = rewards.detach().double()
    count, total = group_count_and_sum(r, group_index)
    baseline = (total - r) / (count - 1).clamp(min=1)  # the sum without i, over the others
    adv = torch.where(count > 1, r - baseline, 0.0)
    return broadcast_masked(adv, m, compute_dtype(rewards))


def broadcast_masked(per_response: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """``[B]`` values on the valid tokens of a bool ``[B, T]`` mask, 0 elsewhere, in ``dtype``."""
    return torch.where(mask, per_response[:, None], 0.0).to(dtype)


def group_mean_std(rewards: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Each response's group mean and Bessel std (ddof = 1; 0 for a group of one), float64 ``[B]``."""
    r = rewards.detach().double()
    count, total = group_count_and_sum(r, group_index)
    mean = total / count
    _, squares = group_count_and_sum((r - mean).square(), group_index)
    std = torch.where(count > 1, squares / (count - 1).clamp(min=1), 0.0).sqrt()
    return mean, std


def group_count_and_sum(r: Tensor, group_index: Tensor) -> tuple[Tensor, Tensor]:
    """Each response's group size and group reward sum, ``[B]`` in ``r``'s dtype."""
    _, inverse = torch.unique(group_index, return_inverse=True)
    zeros = torch.zeros_like(r)
    count = zeros.index_add(0, inverse, torch.ones_like(r))[inverse]
    return count, zeros.index_add(0, inverse, r)[inverse]
