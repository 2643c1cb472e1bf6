"""The sampler's log-probs in the update (reinforce_plus_plus.md §7a): which log-probs are
pi_old, the truncated importance weight (``--use-tis``), the off-policy sequence mask
(``--use-opsm``) and the mismatch metrics. The formulas are relax/algorithms/sampler_mismatch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.algorithms import opsm_keep, tis_weights
from relax.config.sections import OffPolicySection
from relax.errors import RelaxError
from relax.plugins import call_plugin, load_function
from relax.rollout.reward.scoring import plugin_tensor

MISMATCH_METRICS = ("rollout/logprob_abs_diff", "rollout/logprob_abs_diff_max",
                    "rollout/mismatch_k1", "rollout/mismatch_k3",
                    "rollout/mismatch_ratio_outside")
TIS_FLAG = "--custom-tis-function-path"


@dataclass(frozen=True)
class OffPolicy:
    """The off-policy section (``cfg.rollout.off_policy``) with its
    ``--custom-tis-function-path`` plug-in loaded (``tis_fn``; None: :func:`~relax.algorithms.
    tis_weights`)."""

    section: OffPolicySection = OffPolicySection()
    tis_fn: object = None

    @classmethod
    def load(cls, section: OffPolicySection) -> OffPolicy:
        path = section.custom_tis_path
        return cls(section, load_function(path, TIS_FLAG) if path else None)

    @property
    def metric_names(self) -> tuple[str, ...]:
        s = self.section
        return ((("train/tis_weight_mean", "train/tis_clipfrac") if s.use_tis else ())
                + (("train/opsm_masked_fraction",) if s.use_opsm else ()))


def behaviour_log_probs(trainer_old: torch.Tensor, sampler: torch.Tensor | None,
                        s: OffPolicy) -> torch.Tensor:
    """pi_old of the PPO ratio: the sampler's with ``--use-rollout-logprobs``, else the
    trainer's."""
    if not s.section.use_rollout_logprobs:
        return trainer_old
    if sampler is None:
        raise RelaxError("--use-rollout-logprobs: this rollout carries no sampler log-probs")
    return sampler


def corrected(pg: torch.Tensor, *, log_probs, trainer_old, sampler, advantages, mask,
              s: OffPolicy, reduce) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The per-token policy loss [B, T] times the TIS weight and the OPSM mask (both constants
    of the loss), and their metrics reduced like the loss (``reduce``), in the order of
    ``s.metric_names``."""
    stats, section = [], s.section
    if section.use_tis:
        if s.tis_fn is not None:
            w, clipped = _plugin_weights(s.tis_fn, trainer_old, sampler, mask)
        else:
            w, clipped = tis_weights(trainer_old, sampler, mask, clip=section.tis_clip,
                                     clip_low=section.tis_clip_low)
        pg = pg * w.to(pg.dtype)
        stats += [reduce(w), reduce(clipped.float())]
    if section.use_opsm:
        keep = opsm_keep(log_probs, sampler, advantages, mask, delta=section.opsm_delta)
        pg = pg * keep[:, None].to(pg.dtype)
        stats.append(reduce((~keep)[:, None].expand_as(mask).float()))
    return pg, stats


def _plugin_weights(fn, trainer_old, sampler, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """``fn(trainer_log_probs, sampler_log_probs, mask) -> weights [B, T]``, checked: finite
    and >= 0 on the mask. Its clipped fraction is 0 (the plug-in decides what it clips)."""
    returned = call_plugin(fn, TIS_FLAG, trainer_old.detach().clone(), sampler.clone(),
                           mask.clone())
    w = plugin_tensor(returned, TIS_FLAG, "weights >= 0, finite on the mask,", mask.shape,
                      device=mask.device, finite_on=mask, error=RelaxError)
    if (w[mask] < 0).any():
        raise RelaxError(f"{TIS_FLAG} returned weights that are negative on the response mask")
    return torch.where(mask, w, torch.zeros_like(w)).detach(), torch.zeros_like(mask)


class MismatchMeter:
    """``add(sums)`` per micro-batch (:func:`~relax.algorithms.mismatch_sums`), kept on the
    device; ``report(tracker)`` once per step adds the step's means over every masked token and
    the maximum to the metrics: one host sync per step, not one per value and micro-batch."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] | None = None

    def add(self, sums: dict[str, torch.Tensor]) -> None:
        if self.sums is None:
            self.sums = {k: v.detach().clone() for k, v in sums.items()}
            return
        for k, v in sums.items():
            self.sums[k] = (torch.maximum(self.sums[k], v) if k == "abs_diff_max"
                            else self.sums[k] + v)

    def report(self, tracker) -> None:
        if self.sums is None:  # no update this step (dynamic sampling kept no group)
            return
        keys = ("tokens", "abs_diff", "abs_diff_max", "k1", "k3", "outside")
        tokens, abs_diff, abs_max, k1, k3, outside = torch.stack(
            [self.sums[k].double() for k in keys]).tolist()
        names = dict(zip(("abs_diff", "abs_max", "k1", "k3", "outside"), MISMATCH_METRICS,
                         strict=True))
        tracker.add_ratio(names["abs_diff"], abs_diff, tokens)
        tracker.add_max(names["abs_max"], abs_max)
        tracker.add_ratio(names["k1"], k1, tokens)
        tracker.add_ratio(names["k3"], k3, tokens)
        tracker.add_ratio(names["outside"], outside, tokens)
        self.sums = None
