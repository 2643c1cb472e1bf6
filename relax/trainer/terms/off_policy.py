"""The sampler's log-probs in the update (reinforce_plus_plus.md §7a): which log-probs are
pi_old, and three terms (relax/trainer/terms/term.py): the truncated importance weight
(``--use-tis``), the off-policy sequence mask (``--use-opsm``) and the mismatch metrics
(``--get-mismatch-metrics``). The formulas are relax/algorithms/sampler_mismatch.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.algorithms import mismatch_sums, opsm_keep, tis_weights
from relax.config.sections import OffPolicySection
from relax.errors import RelaxError
from relax.plugins import call_plugin, load_function
from relax.rollout.reward.scoring import plugin_tensor
from relax.trainer.terms.term import LossView, Term

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
        path = section.custom_tis_function_path
        return cls(section, load_function(path, TIS_FLAG) if path else None)

    @property
    def metric_names(self) -> tuple[str, ...]:
        return tuple(name for term in corrections(self) for name in term.metric_names)


def behaviour_log_probs(trainer_old: torch.Tensor, sampler: torch.Tensor | None,
                        s: OffPolicy) -> torch.Tensor:
    """pi_old of the PPO ratio: the sampler's with ``--use-rollout-logprobs``, else the
    trainer's."""
    if not s.section.use_rollout_logprobs:
        return trainer_old
    if sampler is None:
        raise RelaxError("--use-rollout-logprobs: this rollout carries no sampler log-probs")
    return sampler


class TruncatedImportance(Term):
    """``--use-tis``: the per-token policy loss times the truncated importance weight of the
    trainer's pi_old to the sampler's (§7a; a constant of the loss), or of the
    ``--custom-tis-function-path`` plug-in; metrics ``train/tis_weight_mean`` and
    ``train/tis_clipfrac``, reduced like the loss."""

    metric_names = ("train/tis_weight_mean", "train/tis_clipfrac")

    def __init__(self, s: OffPolicy):
        self.section, self.fn = s.section, s.tis_fn

    def correct(self, pg, view: LossView):
        sampler, mask = view.mb.rollout_log_probs, view.mask
        if self.fn is not None:
            w, clipped = _plugin_weights(self.fn, view.trainer_old, sampler, mask)
        else:
            w, clipped = tis_weights(view.trainer_old, sampler, mask, clip=self.section.tis_clip,
                                     clip_low=self.section.tis_clip_low)
        return pg * w.to(pg.dtype), [view.reduce(w), view.reduce(clipped.float())]


class SequenceMask(Term):
    """``--use-opsm``: the per-token policy loss of the responses OPSM drops set to 0 (§7a);
    metric ``train/opsm_masked_fraction``, reduced like the loss."""

    metric_names = ("train/opsm_masked_fraction",)

    def __init__(self, s: OffPolicy):
        self.delta = s.section.opsm_delta

    def correct(self, pg, view: LossView):
        mask = view.mask
        keep = opsm_keep(view.log_probs, view.mb.rollout_log_probs, view.mb.advantages, mask,
                         delta=self.delta)
        return (pg * keep[:, None].to(pg.dtype),
                [view.reduce((~keep)[:, None].expand_as(mask).float())])


def corrections(s: OffPolicy) -> tuple[Term, ...]:
    """The configured corrections of the policy loss, in the order they multiply it."""
    return ((TruncatedImportance(s),) if s.section.use_tis else ()) + (
        (SequenceMask(s),) if s.section.use_opsm else ())


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


class MismatchMeter(Term):
    """``--get-mismatch-metrics``: the trainer's pi_old against the sampler's log-probs
    (:func:`~relax.algorithms.mismatch_sums`) of every micro-batch the update runs, kept on
    the device (``add``); ``report(tracker)`` once per step adds the step's means over every
    masked token and the maximum to the metrics: one host sync per step, not one per value and
    micro-batch."""

    def __init__(self):
        self.sums: dict[str, torch.Tensor] | None = None

    def observe(self, view: LossView) -> None:
        if view.mb.rollout_log_probs is not None:  # a sampler that gave no log-probs
            self.add(mismatch_sums(view.trainer_old, view.mb.rollout_log_probs, view.mask))

    def after_update(self, tracker) -> None:
        self.report(tracker)

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
