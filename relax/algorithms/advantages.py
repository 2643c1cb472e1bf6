"""Raw returns and advantages of the five estimators (reinforce_plus_plus.md §3, 4, 5).

All functions are pure: tensors in, tensors out, no process group (group statistics are
per prompt group, and a prompt group never straddles data-parallel ranks). Outputs are
exactly 0 outside the mask, float32 for float32/bf16/fp16 inputs and float64 for float64.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from relax.algorithms._checks import (
    as_bool_mask,
    check_group_index,
    check_like_mask,
    check_per_response,
    compute_dtype,
    keep_bits,
    numpy_path,
    select_,
    select_rows,
)
from relax.algorithms.scan import discounted_reverse_cumsum, new_scan_buffer


def last_valid_position(mask: Tensor) -> Tensor:
    """``T_i``: index of the last ``True`` in each row of a bool ``[B, T]`` mask; -1 if none.

    int64 [B] on the mask's device. On the CPU NumPy finds the first ``True`` of each
    reversed row on the bytes (~4 ms at 1024 x 8192; the torch ops below measured 3-7x
    slower there); elsewhere torch does the same with a flip (no [B, T] int64 temporary)."""
    B, T = mask.shape
    if T == 0:
        return torch.full((B,), -1, dtype=torch.long, device=mask.device)
    if numpy_path(mask):
        m = mask.detach().numpy()
        last = (T - 1) - np.argmax(m[:, ::-1], axis=1)
        return torch.from_numpy(np.where(m.any(axis=1), last, -1).astype(np.int64))
    from_end = mask.flip(1).view(torch.uint8).argmax(dim=1)
    return torch.where(mask.any(dim=1), T - 1 - from_end, -1)


def reinforce_plus_plus_returns(
    rewards: Tensor,
    old_log_probs: Tensor | None,
    ref_log_probs: Tensor | None,
    mask: Tensor,
    *,
    kl_coef: float,
    gamma: float = 1.0,
) -> Tensor:
    """REINFORCE++ token returns ``G`` [B, T] (reinforce_plus_plus.md §3).

        d[i,t] = old_log_probs - ref_log_probs                (signed k1)
        r[i,t] = m * (-kl_coef * d + 1(t = T_i) * rewards[i])
        G[i,t] = m * sum_{u=t}^{T_i} gamma^(u-t) * r[i,u]     (positions, holes included)

    ``old_log_probs`` / ``ref_log_probs`` may be ``None`` only when ``kl_coef == 0``.
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    if kl_coef != 0:
        if old_log_probs is None or ref_log_probs is None:
            raise ValueError("old_log_probs and ref_log_probs are required when kl_coef != 0")
        check_like_mask(old_log_probs, m, "old_log_probs")
        check_like_mask(ref_log_probs, m, "ref_log_probs")
    dtype = compute_dtype(rewards, old_log_probs, ref_log_probs)
    G, _ = rpp_returns_masked(
        rewards, old_log_probs, ref_log_probs, m, keep_bits(m, dtype), kl_coef=kl_coef, gamma=gamma, dtype=dtype
    )
    return G


def rpp_returns_masked(
    rewards: Tensor,
    old_log_probs: Tensor | None,
    ref_log_probs: Tensor | None,
    m: Tensor,
    keep: Tensor,
    *,
    kl_coef: float,
    gamma: float,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor | None]:
    """:func:`reinforce_plus_plus_returns` on checked inputs, with the mask's select bits
    (``keep_bits(m, dtype)``) passed in so the dispatcher computes them once.

    Returns ``(G, scratch)``: ``scratch`` is a free contiguous [B, T] buffer of G's dtype
    (the scan input, no longer needed) that the caller may reuse for the advantages instead
    of allocating, or ``None``."""
    if not (0.0 < gamma <= 1.0):
        raise ValueError(f"gamma={gamma!r} must lie in (0, 1]")
    if kl_coef < 0:
        raise ValueError(f"kl_coef={kl_coef!r} must be >= 0")
    B, T = m.shape

    # r is written straight into the (zero-tailed) scan buffer: no extra padding copy.
    buf = new_scan_buffer(B, T, dtype, m.device)
    r = buf[:, :T]
    last = last_valid_position(m)
    terminal = rewards.detach().to(dtype)
    scale = 1.0
    if kl_coef != 0:
        torch.sub(old_log_probs.detach().to(dtype), ref_log_probs.detach().to(dtype), out=r)
        # Masked positions (where Inf - Inf may have made NaN) are reset to +0.0 by a
        # bitwise select before any value crosses positions in the scan.
        select_(r, keep)
        # r = -kl_coef * (d - e_T * R / kl_coef): the factor -kl_coef is applied inside the
        # scan's matrices instead of as a separate pass over [B, T].
        scale = -kl_coef
        terminal = terminal / scale
    else:
        r.zero_()
    zero = torch.zeros((), dtype=dtype, device=m.device)
    # The terminal reward lands on T_i only; a fully masked row keeps its zeros (its reward,
    # possibly NaN, is never read).
    r[torch.arange(B, device=m.device), last.clamp(min=0)] += torch.where(last >= 0, terminal, zero)

    G = discounted_reverse_cumsum(buf, T, gamma, scale=scale)
    if not G.is_contiguous():
        G = G.contiguous()
    # Zero outside the mask: holes and padding receive the discounted return in the scan.
    scratch = buf if buf.shape[1] == T else None
    return select_(G, keep), scratch


def reinforce_plus_plus_baseline_advantages(
    rewards: Tensor, group_index: Tensor, mask: Tensor
) -> Tensor:
    """REINFORCE++-baseline raw advantage ``A_raw`` [B, T] (reinforce_plus_plus.md §4).

        b_g = mean_{j in g} rewards[j]     (inclusive; fully masked members count)
        A_raw[i,t] = m * (rewards[i] - b_g)  (never divided by a std)
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    check_group_index(group_index, m)
    dtype = compute_dtype(rewards)
    return broadcast_masked(baseline_rows(rewards, group_index), m, dtype)


def baseline_rows(rewards: Tensor, group_index: Tensor) -> Tensor:
    """Per-response value of :func:`reinforce_plus_plus_baseline_advantages`, float64 [B]."""
    mean, _ = _group_mean_std(rewards, group_index, want_std=False)
    return rewards.double() - mean


def group_relative_advantages(
    rewards: Tensor, group_index: Tensor, mask: Tensor, *, std_normalization: bool = True
) -> Tensor:
    """GRPO-family advantage [B, T] (reinforce_plus_plus.md §5), broadcast to valid tokens.

        A_i = rewards[i] - mean_g(rewards)
        A_i = A_i / (std_g(rewards) + 1e-6)   if std_normalization (ddof = 1; one member: std 0)
    """
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    check_group_index(group_index, m)
    dtype = compute_dtype(rewards)
    return broadcast_masked(group_relative_rows(rewards, group_index, std_normalization), m, dtype)


def group_relative_rows(rewards: Tensor, group_index: Tensor, std_normalization: bool) -> Tensor:
    """Per-response value of :func:`group_relative_advantages`, float64 [B]."""
    mean, std = _group_mean_std(rewards, group_index, want_std=std_normalization)
    adv = rewards.double() - mean
    return adv / (std + 1e-6) if std_normalization else adv


def broadcast_masked(per_response: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[B] values broadcast over the valid tokens of a bool [B, T] mask, +0.0 elsewhere."""
    return select_rows(per_response.to(dtype), keep_bits(mask, dtype))


def _group_mean_std(
    rewards: Tensor, group_index: Tensor, *, want_std: bool
) -> tuple[Tensor, Tensor | None]:
    """Per-response group mean and Bessel std (ddof = 1, 0 for a group of one), float64 [B].

    Groups are gathered with scatter-adds over the compacted group ids, not a loop."""
    r = rewards.double()
    _, inverse = torch.unique(group_index, return_inverse=True)
    B = r.shape[0]
    count = torch.zeros(B, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, torch.ones_like(r)
    )
    total = torch.zeros(B, dtype=torch.float64, device=r.device).index_add_(0, inverse, r)
    mean = (total / count.clamp(min=1))[inverse]
    if not want_std:
        return mean, None
    sq = torch.zeros(B, dtype=torch.float64, device=r.device).index_add_(
        0, inverse, (r - mean).square()
    )
    n = count[inverse]
    std = torch.where(n > 1, (sq[inverse] / (n - 1).clamp(min=1)).sqrt(), torch.zeros_like(r))
    return mean, std
