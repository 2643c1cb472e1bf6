"""PPO with a learned critic: GAE, the clipped value loss and explained variance
(reinforce_plus_plus.md §5c).

Pure tensor functions over masked ``[B, T]`` tensors: the process group of a reduction is an
argument, nothing reads a config. Sums are accumulated in float64; outputs are exactly 0
outside the mask, float32 for float32/bf16/fp16 inputs and float64 for float64 inputs.

Holes in the mask (the environment's tokens of a multi-turn episode) are skipped: the
recursion runs over the valid tokens of a row in order, as if the holes were not there, so
``gamma`` and ``lambda`` discount once per model token and a value at a hole is never read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from relax.algorithms._checks import (
    as_bool_mask,
    check_like_mask,
    check_per_response,
    compute_dtype,
)
from relax.algorithms.advantages import last_valid_position
from relax.collectives import all_reduce


def _check_unit(name: str, x: float) -> None:
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name}={x!r} must lie in [0, 1]")


def terminal_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """``r[i,t] = rewards[i]`` at ``T_i`` (the last valid token), 0 elsewhere; [B, T] float64."""
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    last = last_valid_position(m)
    positions = torch.arange(m.shape[1], device=m.device)
    at_end = (positions[None, :] == last[:, None]) & m
    return torch.where(at_end, rewards.detach().double()[:, None], 0.0)


def gae_advantages(token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float,
                   lambd: float) -> Tensor:
    """Generalized advantage estimation ``A`` [B, T] over the valid tokens (§5c).

        next(t)  = the next valid position after t in the row (none after T_i)
        delta_t  = r_t + gamma * V_next(t) - V_t            (V after T_i is 0: terminal)
        A_t      = delta_t + gamma * lambd * A_next(t)      (A after T_i is 0)

    ``token_rewards`` and ``values`` [B, T] (both detached: the advantage is a constant of the
    loss); ``mask`` [B, T]. A reverse loop over positions carrying the next valid token's value
    and advantage; a hole leaves both carried unchanged."""
    m = as_bool_mask(mask)
    check_like_mask(token_rewards, m, "token_rewards")
    check_like_mask(values, m, "values")
    _check_unit("gamma", gamma)
    _check_unit("lambd", lambd)
    dtype = compute_dtype(token_rewards, values)
    r = torch.where(m, token_rewards.detach().double(), 0.0)
    v = torch.where(m, values.detach().double(), 0.0)
    adv = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        valid = m[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        a = delta + gamma * lambd * next_adv
        adv[:, t] = torch.where(valid, a, 0.0)
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, a, next_adv)
    return adv.to(dtype)


def gae_returns(advantages: Tensor, values: Tensor, mask: Tensor) -> Tensor:
    """The value targets ``R = A + V`` [B, T] on the valid tokens, 0 elsewhere (detached)."""
    m = as_bool_mask(mask)
    check_like_mask(advantages, m, "advantages")
    check_like_mask(values, m, "values")
    dtype = compute_dtype(advantages, values)
    total = advantages.detach().double() + values.detach().double()
    return torch.where(m, total, 0.0).to(dtype)


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *,
                       value_clip: float | None) -> tuple[Tensor, Tensor]:
    """PPO2's per-token value loss and where the clipped term won, both [B, T] (§5c).

        V_clip = V_old + clamp(V - V_old, -c, c)
        loss   = 0.5 * max((V - R)^2, (V_clip - R)^2)          (c = value_clip)
        loss   = 0.5 * (V - R)^2                               (value_clip None: no clip)

    ``values`` carries the gradient; ``old_values`` (the critic before the update) and
    ``returns`` are detached. ``clipped`` [B, T] bool marks the valid tokens where the
    clipped error is strictly larger. 0 / False outside ``mask``."""
    m = as_bool_mask(mask)
    for name, x in (("values", values), ("old_values", old_values), ("returns", returns)):
        check_like_mask(x, m, name)
    if value_clip is not None and value_clip < 0:
        raise ValueError(f"value_clip={value_clip!r} must be >= 0")
    old, target = old_values.detach(), returns.detach()
    unclipped = (values - target).square()
    if value_clip is None:
        loss, clipped = unclipped, torch.zeros_like(m)
    else:
        v_clip = old + (values - old).clamp(-value_clip, value_clip)
        clipped_err = (v_clip - target).square()
        loss = torch.maximum(unclipped, clipped_err)
        clipped = (clipped_err > unclipped).detach() & m
    return torch.where(m, 0.5 * loss, 0.0), clipped


def value_statistics(values: Tensor, returns: Tensor, mask: Tensor, *,
                     group=None) -> dict[str, Tensor]:
    """Global token statistics over every rank of ``group`` (0-d float64, one all-reduce):

    - ``critic/explained_variance``: ``1 - Var(R - V) / Var(R)`` (population variances over
      the valid tokens); 0 when ``Var(R) = 0`` (a constant target: nothing to explain);
    - ``critic/values_mean``: the mean of ``V``.
    """
    m = as_bool_mask(mask)
    check_like_mask(values, m, "values")
    check_like_mask(returns, m, "returns")
    v = torch.where(m, values.detach().double(), 0.0)
    r = torch.where(m, returns.detach().double(), 0.0)
    e = r - v
    sums = all_reduce(torch.stack([m.sum().double(), v.sum(), r.sum(), r.square().sum(),
                                   e.sum(), e.square().sum()]), group)
    n = sums[0].clamp(min=1.0)
    var_r = sums[3] / n - (sums[2] / n).square()
    var_e = sums[5] / n - (sums[4] / n).square()
    has_var = var_r > 1e-12
    ev = torch.where(has_var, 1.0 - var_e / torch.where(has_var, var_r, 1.0), 0.0)
    return {"critic/explained_variance": ev, "critic/values_mean": sums[1] / n}
