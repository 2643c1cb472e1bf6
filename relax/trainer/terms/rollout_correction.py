"""The rollout correction (reinforce_plus_plus.md §7c) as a training term: the configured parts
of ``--rollout-is``, ``--rollout-rs`` and ``--rollout-token-veto-threshold`` multiply the
per-token policy loss, each part a factor from relax/algorithms/rollout_correction.py and its
metrics. The formulas are there; this module only composes them and keeps the step's weight
sums on the device (one host sync per step, in ``after_update``).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from relax.algorithms.rollout_correction import (
    importance_weights,
    rejection_keep,
    veto_keep,
    weight_sums,
)
from relax.config.sections import OffPolicySection
from relax.errors import RelaxError
from relax.trainer.terms.term import LossView, Term

# a part: (trainer_old [B, T], sampler [B, T], mask [B, T]) -> (factor [B, T], the tokens it
# changed [B, T] bool, the weights [B, T] whose sums the ESS reads, or None)
Part = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]

IS_WEIGHT_METRICS = ("train/rollout_is_weight_max", "train/rollout_is_ess")


def _weights(q, s, mask, **bounds):
    w, outside = importance_weights(q, s, mask, **bounds)
    return w, outside, w


def _rejection(q, s, mask, **bounds):
    keep = rejection_keep(q, s, mask, **bounds)
    return keep, ~keep & mask, None


def _veto(q, s, mask, *, threshold):
    keep = veto_keep(q, s, mask, threshold=threshold)[:, None].expand_as(mask)
    return keep, ~keep & mask, None


def parts(s: OffPolicySection) -> tuple[tuple[str, Part], ...]:
    """The configured parts in the order they multiply: the importance weight, the rejection,
    the veto; each with the name of the metric of the tokens it changed."""
    out = []
    if s.rollout_is is not None:
        changed = "truncated" if s.rollout_is_mode == "truncate" else "masked"
        out.append((f"train/rollout_is_{changed}_fraction", partial(
            _weights, level=s.rollout_is, mode=s.rollout_is_mode,
            low=s.rollout_is_threshold_lower, high=s.rollout_is_threshold)))
    if s.rollout_rs is not None:
        low, high = s.rs_bounds()
        what = "masked" if s.rollout_rs == "token" else "rejected"
        out.append((f"train/rollout_rs_{what}_fraction",
                    partial(_rejection, kind=s.rollout_rs, low=low, high=high)))
    if s.rollout_token_veto_threshold is not None:
        out.append(("train/rollout_veto_fraction",
                    partial(_veto, threshold=s.rollout_token_veto_threshold)))
    return tuple(out)


class RolloutCorrection(Term):
    """§7c: ``pg' = w * keep_rs * keep_veto * pg``. Metrics reduced like the loss: the share
    of tokens each part changed (``train/rollout_is_truncated_fraction`` or ``_masked_``,
    ``train/rollout_rs_masked_fraction`` (token) or ``_rejected_`` (a row rule),
    ``train/rollout_veto_fraction``) and ``train/rollout_is_weight_mean``; over the step's
    tokens, all ranks: ``train/rollout_is_weight_max`` and ``train/rollout_is_ess``."""

    def __init__(self, s: OffPolicySection):
        self.parts = parts(s)
        self.weighted = s.rollout_is is not None
        self.metric_names = (("train/rollout_is_weight_mean",) if self.weighted else ()) + \
            tuple(name for name, _ in self.parts)
        self.sums: torch.Tensor | None = None  # [4] weight_sums over the step's micro-batches

    @classmethod
    def build(cls, s: OffPolicySection) -> RolloutCorrection | None:
        return cls(s) if s.rollout_correction else None

    def correct(self, pg, view: LossView):
        sampler, mask = view.mb.rollout_log_probs, view.mask
        if sampler is None:
            raise RelaxError("--rollout-is/--rollout-rs/--rollout-token-veto-threshold: this "
                             "rollout carries no sampler log-probs")
        factor, stats = torch.ones_like(pg), []
        for _, part in self.parts:
            f, changed, w = part(view.trainer_old, sampler, mask)
            factor = factor * f.to(pg.dtype)
            if w is not None:
                stats.append(view.reduce(w))
                self._add(weight_sums(w, mask))
            stats.append(view.reduce(changed.float()))
        return pg * factor, stats

    def _add(self, sums: torch.Tensor) -> None:
        if self.sums is None:
            self.sums = sums.clone()
            return
        self.sums[:3] += sums[:3]
        self.sums[3] = torch.maximum(self.sums[3], sums[3])

    def after_update(self, tracker) -> None:
        if self.sums is None:  # no update this step, or no weights configured
            return
        count, total, squares, top = self.sums.tolist()
        tracker.add_max(IS_WEIGHT_METRICS[0], top)
        tracker.add_ess(IS_WEIGHT_METRICS[1], count, total, squares)
        self.sums = None
