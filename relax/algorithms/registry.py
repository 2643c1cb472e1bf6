"""The estimator registry and the production dispatcher (reinforce_plus_plus.md §3-§7, 10, 13).

Each :data:`ESTIMATORS` entry is the estimator's facts (:mod:`relax.estimators`, torch-free so
configuration checks need no torch) plus its pure functions: ``raw_advantages`` (a rollout
batch to raw ``[B, T]`` advantages, which are also the reported returns) and ``policy_loss``.
Nothing below branches on an estimator's name.
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
)
from relax.algorithms.advantages import (
    group_relative_advantages,
    reinforce_plus_plus_baseline_advantages,
    reinforce_plus_plus_returns,
    rloo_advantages,
)
from relax.algorithms.losses import cispo_loss, gspo_loss, ppo_clip_loss, rloo_loss, sapo_loss
from relax.algorithms.normalization import (
    NormalizationStats,
    masked_moments,
    population_scale,
    stats_of,
    whiten_scale,
)
from relax.algorithms.value import gae_advantages, terminal_rewards
from relax.collectives import all_reduce
from relax.config.sections.algorithm import AlgorithmSection
from relax.estimators import FACTS, EstimatorFacts, facts


@dataclass(frozen=True)
class RolloutBatch:
    """The checked rollout tensors an estimator's ``raw_advantages`` reads."""

    rewards: Tensor  # [B]
    mask: Tensor  # [B, T] bool
    group_index: Tensor | None  # [B] int, the prompt of each response
    old_log_probs: Tensor | None  # [B, T]
    ref_log_probs: Tensor | None  # [B, T]
    values: Tensor | None = None  # [B, T] the critic's, where ``facts.needs_critic`` (§5c)


@dataclass
class AdvantageOutput:
    """``advantages``/``returns`` [B, T] (0 outside the mask), the global ``stats`` (raw =
    before normalization) and the ``rollout/...`` metrics of §10 as 0-d float64 tensors."""

    advantages: Tensor
    returns: Tensor
    stats: NormalizationStats
    metrics: dict[str, Tensor]


def _rpp_returns(b: RolloutBatch, s: AlgorithmSection) -> Tensor:
    return reinforce_plus_plus_returns(b.rewards, b.old_log_probs, b.ref_log_probs, b.mask,
                                       kl_coef=s.kl_coef, gamma=s.gamma)


def _baseline(b: RolloutBatch, s: AlgorithmSection) -> Tensor:
    return reinforce_plus_plus_baseline_advantages(b.rewards, b.group_index, b.mask)


def _group_relative(b: RolloutBatch, s: AlgorithmSection) -> Tensor:
    return group_relative_advantages(b.rewards, b.group_index, b.mask,
                                     std_normalization=not s.disable_grpo_std_normalization)


def _leave_one_out(b: RolloutBatch, s: AlgorithmSection) -> Tensor:
    return rloo_advantages(b.rewards, b.group_index, b.mask)


def _gae(b: RolloutBatch, s: AlgorithmSection) -> Tensor:
    return gae_advantages(terminal_rewards(b.rewards, b.mask), b.values, b.mask,
                          gamma=s.gamma, lambd=s.lambd)


def _ppo(lp, old, adv, mask, p: AlgorithmSection) -> tuple[Tensor, Tensor]:
    return ppo_clip_loss(lp, old, adv, mask, eps_clip=p.eps_clip,
                         eps_clip_high=p.eps_clip_high, eps_clip_c=p.eps_clip_c)


def _gspo(lp, old, adv, mask, p: AlgorithmSection) -> tuple[Tensor, Tensor]:
    return gspo_loss(lp, old, adv, mask, eps_clip=p.eps_clip, eps_clip_high=p.eps_clip_high)


def _sapo(lp, old, adv, mask, p: AlgorithmSection) -> tuple[Tensor, Tensor]:
    pg = sapo_loss(lp, old, adv, mask, tau_pos=p.sapo_tau_pos, tau_neg=p.sapo_tau_neg)
    return pg, torch.zeros_like(pg, dtype=torch.bool)  # no clip: nothing is ever clipped


def _cispo(lp, old, adv, mask, p: AlgorithmSection) -> tuple[Tensor, Tensor]:
    return cispo_loss(lp, old, adv, mask, eps_clip=p.eps_clip, eps_clip_high=p.eps_clip_high)


def _rloo(lp, old, adv, mask, p: AlgorithmSection) -> tuple[Tensor, Tensor]:
    pg = rloo_loss(lp, adv, mask)  # no ratio: pi_old is not read (§5a)
    return pg, torch.zeros_like(pg, dtype=torch.bool)


@dataclass(frozen=True)
class Estimator:
    facts: EstimatorFacts
    raw_advantages: Callable[[RolloutBatch, AlgorithmSection], Tensor]
    policy_loss: Callable[..., tuple[Tensor, Tensor]]  # (lp, old, adv, mask, settings) -> (pg, clipped)

    @property
    def name(self) -> str:
        return self.facts.name


_POLICY_LOSSES = {"ppo_clip": _ppo, "gspo": _gspo, "sapo": _sapo, "cispo": _cispo,
                  "rloo": _rloo}
_RAW_ADVANTAGES = {
    "reinforce_plus_plus": _rpp_returns,
    "reinforce_plus_plus_baseline": _baseline,
    "grpo": _group_relative,
    "gspo": _group_relative,
    "sapo": _group_relative,
    "cispo": _group_relative,
    "rloo": _leave_one_out,
    "ppo": _gae,
}
ESTIMATORS: dict[str, Estimator] = {
    name: Estimator(f, _RAW_ADVANTAGES[name], _POLICY_LOSSES[f.policy_loss])
    for name, f in FACTS.items()
}


def get_estimator(name: str) -> Estimator:
    """Look an estimator up by name; an unknown name lists the valid ones."""
    return ESTIMATORS[facts(name).name]


def _checked_batch(f: EstimatorFacts, s: AlgorithmSection, rewards, mask, group_index,
                   old_log_probs, ref_log_probs, values=None) -> RolloutBatch:
    if f.frozen and not s.normalize_advantages:
        raise ValueError(
            f"estimator {f.name!r} requires normalize_advantages=True "
            "(reinforce_plus_plus.md §6: the global masked normalization is part of its definition)"
        )
    if f.normalization == "none" and s.normalize_advantages:
        raise ValueError(f"{f.name} requires normalize_advantages=False (reinforce_plus_plus.md "
                         f"{f.section}: the advantage keeps the reward's scale)")
    if s.kl_coef != 0 and not f.kl_in_reward:
        raise ValueError(f"{f.name} requires kl_coef == 0 (reinforce_plus_plus.md {f.section}: "
                         "no KL in the advantage)")
    m = as_bool_mask(mask)
    check_per_response(rewards, m, "rewards")
    if f.needs_group_index:
        if group_index is None:
            raise ValueError(f"estimator {f.name!r} needs group_index [B]")
        check_group_index(group_index, m)
    if s.kl_coef != 0:
        for name, lp in (("old_log_probs", old_log_probs), ("ref_log_probs", ref_log_probs)):
            if lp is None:
                raise ValueError(f"{name} [B, T] is required by {f.name} with kl_coef != 0")
            check_like_mask(lp, m, name)
    if f.needs_critic:
        if values is None:
            raise ValueError(f"estimator {f.name!r} needs the critic's values [B, T]")
        check_like_mask(values, m, "values")
    return RolloutBatch(rewards, m, group_index, old_log_probs, ref_log_probs, values)


def compute_advantages_and_returns(
    settings: AlgorithmSection,
    rewards: Tensor,
    mask: Tensor,
    *,
    group_index: Tensor | None = None,
    old_log_probs: Tensor | None = None,
    ref_log_probs: Tensor | None = None,
    values: Tensor | None = None,
    group=None,
) -> AdvantageOutput:
    """The production dispatcher: rollout batch -> advantages, returns, stats, metrics.

    ``rewards`` [B], ``mask`` [B, T], ``group_index`` [B] (prompt id of each response; needed
    where ``facts.needs_group_index``), ``old_log_probs``/``ref_log_probs`` [B, T] (needed with
    ``kl_coef != 0``), ``values`` [B, T] (the critic's, needed where ``facts.needs_critic``;
    the raw advantages are then GAE's and ``returns`` stay the raw advantages: the value
    targets are ``A_raw + V``, §5c), ``group`` the data-parallel process group (all moments and metrics are
    global over it). No value is read back to the host.
    """
    est = get_estimator(settings.advantage_estimator)
    batch = _checked_batch(est.facts, settings, rewards, mask, group_index, old_log_probs,
                           ref_log_probs, values)
    shaping = settings.kl_coef != 0
    dtype = compute_dtype(rewards, *((old_log_probs, ref_log_probs) if shaping else ()))
    raw = est.raw_advantages(batch, settings).to(dtype)
    mo = masked_moments(raw, batch.mask, group)
    if est.facts.normalization == "population":  # always (§6)
        inv_std = population_scale(mo, 1e-8)
    elif settings.normalize_advantages:  # whitening on request (§5)
        inv_std = whiten_scale(mo, 1e-8)
    else:
        inv_std = None
    advantages = raw if inv_std is None else (mo.centred * inv_std).to(dtype)
    stats = stats_of(mo, inv_std, 1e-8)
    return AdvantageOutput(advantages, raw, stats, _rollout_metrics(rewards, stats, group))


def _rollout_metrics(rewards: Tensor, stats: NormalizationStats, group) -> dict[str, Tensor]:
    """§10 advantage metrics, global over ``group``; 0-d float64 tensors."""
    count = torch.tensor(float(rewards.shape[0]), dtype=torch.float64, device=rewards.device)
    reward_sums = all_reduce(torch.stack([rewards.detach().double().sum(), count]), group)
    return {
        "rollout/raw_reward": reward_sums[0] / reward_sums[1].clamp(min=1.0),
        # returns are the raw advantages for every estimator (§3, 4, 5, 5a, 5b)
        "rollout/returns": stats.mean,
        "rollout/advantages": stats.normalized_mean,
        "rollout/advantage_raw_mean": stats.mean,
        "rollout/advantage_raw_std": stats.var.sqrt(),
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
    settings: AlgorithmSection | None = None,
    **knobs,
) -> tuple[Tensor, Tensor]:
    """The estimator's per-token policy loss ``(pg [B, T], clipped [B, T] bool)`` (§7).

    ``settings``: the algorithm section (or its loss fields as keywords: ``eps_clip``,
    ``eps_clip_high``, ``eps_clip_c``, ``sapo_tau_pos``, ``sapo_tau_neg``). SAPO and RLOO have no clip; their ``clipped`` is
    all False."""
    if settings is None:
        settings = AlgorithmSection(**knobs)
    return get_estimator(estimator).policy_loss(log_probs, old_log_probs, advantages, mask, settings)
