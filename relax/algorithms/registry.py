"""The estimator name table and the production dispatcher (reinforce_plus_plus.md §3-§7, 10, 13).

Adding an estimator is one :data:`ESTIMATORS` entry plus pure functions: ``tokens`` (a
[B, T] raw advantage) or ``rows`` (one raw value per response) turns a rollout batch into
raw advantages (also the reported returns), ``normalizer`` names the global normalization,
``policy_loss`` the per-token loss.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from relax.algorithms._checks import (
    as_bool_mask,
    check_group_index,
    check_like_mask,
    check_per_response,
    compute_dtype,
    keep_bits,
)
from relax.algorithms.advantages import (
    baseline_rows,
    group_relative_rows,
    rpp_returns_masked,
)
from relax.algorithms.losses import gspo_loss, ppo_clip_loss, sapo_loss
from relax.algorithms.normalization import (
    NormalizationStats,
    _all_reduce,
    moments_clean,
    normalize_rows,
    population_normalize_clean,
    whiten_clean,
)


@dataclass(frozen=True)
class AdvantageSettings:
    """Algorithm settings the dispatcher needs (resolved from the command line)."""

    estimator: str
    normalize_advantages: bool = False
    gamma: float = 1.0  # reinforce_plus_plus only
    kl_coef: float = 0.0  # reinforce_plus_plus reward-shaping beta
    std_normalization: bool = True  # group-relative family


@dataclass
class AdvantageOutput:
    """``advantages``/``returns`` [B, T] (0 outside the mask), the global ``stats`` (raw =
    before normalization) and the ``rollout/...`` metrics of reinforce_plus_plus.md §10 as 0-d float64 tensors."""

    advantages: Tensor
    returns: Tensor
    stats: NormalizationStats
    metrics: dict[str, Tensor]


@dataclass(frozen=True)
class Batch:
    """The checked rollout tensors handed to an estimator's ``raw`` function."""

    rewards: Tensor  # [B]
    mask: Tensor  # [B, T] bool
    keep: Tensor | None  # select bits of the mask, see _checks.keep_bits (None: rows path)
    group_index: Tensor | None  # [B] int
    old_log_probs: Tensor | None  # [B, T]
    ref_log_probs: Tensor | None  # [B, T]
    dtype: torch.dtype


# Each ``raw`` returns (raw [B, T] with 0 outside the mask, scratch [B, T] or None): the
# scratch buffer, when there is one, receives the advantages instead of a new allocation.
def _rpp_raw(b: Batch, s: AdvantageSettings) -> tuple[Tensor, Tensor | None]:
    return rpp_returns_masked(
        b.rewards, b.old_log_probs, b.ref_log_probs, b.mask, b.keep, kl_coef=s.kl_coef, gamma=s.gamma,
        dtype=b.dtype,
    )


# Per-response estimators also give their raw advantage as one float64 value per response
# [B]; the dispatcher then normalizes on [B] (normalization.normalize_rows) and writes each
# [B, T] output once, instead of normalizing B x T tokens.
def _rpp_baseline_rows(b: Batch, s: AdvantageSettings) -> Tensor:
    return baseline_rows(b.rewards, b.group_index)


def _group_rows(b: Batch, s: AdvantageSettings) -> Tensor:
    return group_relative_rows(b.rewards, b.group_index, s.std_normalization)


@dataclass(frozen=True)
class EstimatorSpec:
    name: str
    family: str  # "reinforce_plus_plus" | "group_relative"
    normalizer: str  # "population" (reinforce_plus_plus.md §6, mandatory) | "whiten" (reinforce_plus_plus.md §5, optional)
    policy_loss: str  # "ppo_clip" | "gspo" | "sapo"
    # Exactly one of: ``tokens`` (raw [B, T] and a scratch buffer, see _rpp_raw) or ``rows``
    # (one float64 value per response [B], see _rpp_baseline_rows).
    tokens: Callable[[Batch, AdvantageSettings], tuple[Tensor, Tensor | None]] | None = None
    rows: Callable[[Batch, AdvantageSettings], Tensor] | None = None
    needs_group_index: bool = True


ESTIMATORS: dict[str, EstimatorSpec] = {
    spec.name: spec
    for spec in (
        EstimatorSpec("reinforce_plus_plus", "reinforce_plus_plus", "population", "ppo_clip",
                      tokens=_rpp_raw, needs_group_index=False),
        EstimatorSpec("reinforce_plus_plus_baseline", "reinforce_plus_plus", "population",
                      "ppo_clip", rows=_rpp_baseline_rows),
        EstimatorSpec("grpo", "group_relative", "whiten", "ppo_clip", rows=_group_rows),
        EstimatorSpec("gspo", "group_relative", "whiten", "gspo", rows=_group_rows),
        EstimatorSpec("sapo", "group_relative", "whiten", "sapo", rows=_group_rows),
    )
}


def get_estimator(name: str) -> EstimatorSpec:
    """Look an estimator up by name; an unknown name lists the valid ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"estimator={name!r} is unknown; valid estimators: {', '.join(ESTIMATORS)}"
        ) from None


def compute_advantages_and_returns(
    settings: AdvantageSettings,
    rewards: Tensor,
    mask: Tensor,
    *,
    group_index: Tensor | None = None,
    old_log_probs: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    group=None,
) -> AdvantageOutput:
    """The production dispatcher: rollout batch -> advantages, returns, stats, metrics.

    ``rewards`` [B], ``mask`` [B, T], ``group_index`` [B] (prompt id of each response; needed
    by every estimator but ``reinforce_plus_plus``), ``old_log_probs``/``ref_log_probs``
    [B, T] (needed by ``reinforce_plus_plus`` when ``kl_coef != 0``), ``group`` the
    data-parallel process group (all moments and metrics are global over it). No value is
    read back to the host, so the caller decides when to synchronise for logging.
    """
    spec = get_estimator(settings.estimator)
    if spec.family == "reinforce_plus_plus" and not settings.normalize_advantages:
        raise ValueError(
            f"estimator {spec.name!r} requires normalize_advantages=True "
            "(reinforce_plus_plus.md §6: the global masked normalization is part of its definition)"
        )
    if spec.name == "reinforce_plus_plus_baseline" and settings.kl_coef != 0:
        raise ValueError("reinforce_plus_plus_baseline requires kl_coef == 0 (reinforce_plus_plus.md §4: no KL in the advantage)")
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    if spec.needs_group_index:
        if group_index is None:
            raise ValueError(f"estimator {spec.name!r} needs group_index [B]")
        check_group_index(group_index, m)
    uses_kl = spec.name == "reinforce_plus_plus" and settings.kl_coef != 0
    if uses_kl:
        for name, lp in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs)):
            if lp is None:
                raise ValueError(f"{name} [B, T] is required by reinforce_plus_plus with kl_coef != 0")
            check_like_mask(lp, m, name)
    dtype = compute_dtype(rewards, *((old_log_probs, ref_log_probs) if uses_kl else ()))
    # population: always (reinforce_plus_plus.md §6); whiten: on request (reinforce_plus_plus.md §5); none: moments for metrics only
    mode = "population" if spec.normalizer == "population" else (
        "whiten" if settings.normalize_advantages else "none")
    if spec.rows is not None:
        batch = Batch(rewards, m, None, group_index, old_log_probs, ref_log_probs, dtype)
        advantages, raw, stats = normalize_rows(spec.rows(batch, settings), m, dtype, mode=mode, group=group)
        return AdvantageOutput(advantages, raw, stats, _rollout_metrics(rewards, stats, group))
    keep = keep_bits(m, dtype)
    batch = Batch(rewards, m, keep, group_index, old_log_probs, ref_log_probs, dtype)
    raw, scratch = spec.tokens(batch, settings)  # raw: 0 outside the mask
    raw = raw.to(dtype)
    if mode == "population":
        advantages, stats = population_normalize_clean(raw, m, keep, group=group, out=scratch)
    elif mode == "whiten":
        advantages, stats = whiten_clean(raw, m, keep, group=group, out=scratch)
    else:
        advantages, stats = raw, moments_clean(raw, m, keep, group=group, out=scratch)
    return AdvantageOutput(advantages, raw, stats, _rollout_metrics(rewards, stats, group))


def _rollout_metrics(rewards: Tensor, stats: NormalizationStats, group) -> dict[str, Tensor]:
    """reinforce_plus_plus.md §10 advantage metrics, global over ``group``; 0-d float64 tensors."""
    reward_sums = torch.stack(
        [rewards.detach().double().sum(), torch.tensor(float(rewards.shape[0]), dtype=torch.float64, device=rewards.device)]
    )
    _all_reduce(reward_sums, group)
    raw_std = stats.var.sqrt()
    return {
        "rollout/raw_reward": reward_sums[0] / reward_sums[1].clamp(min=1.0),
        # returns are the raw advantages for every estimator (reinforce_plus_plus.md §3, 4, 5)
        "rollout/returns": stats.mean,
        "rollout/advantages": stats.normalized_mean,
        "rollout/advantage_raw_mean": stats.mean,
        "rollout/advantage_raw_std": raw_std,
        "rollout/advantage_normalized_mean": stats.normalized_mean,
        "rollout/advantage_normalized_std": stats.normalized_std,
        "rollout/valid_tokens": stats.count.to(torch.float64),
        "rollout/advantage_zero_variance": stats.zero_variance.to(torch.float64),
    }


def compute_policy_loss(
    estimator: str,
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    eps_clip: float = 0.2,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
) -> tuple[Tensor, Tensor]:
    """The estimator's per-token policy loss ``(pg [B, T], clipped [B, T] bool)`` (reinforce_plus_plus.md §7).

    SAPO has no clip; its ``clipped`` is all False."""
    kind = get_estimator(estimator).policy_loss
    if kind == "ppo_clip":
        return ppo_clip_loss(
            log_probs, old_log_probs, advantages, mask,
            eps_clip=eps_clip, eps_clip_high=eps_clip_high, eps_clip_c=eps_clip_c,
        )
    if kind == "gspo":
        return gspo_loss(log_probs, old_log_probs, advantages, mask, eps_clip=eps_clip, eps_clip_high=eps_clip_high)
    pg = sapo_loss(log_probs, old_log_probs, advantages, mask, tau_pos=tau_pos, tau_neg=tau_neg)
    return pg, torch.zeros_like(pg, dtype=torch.bool)
