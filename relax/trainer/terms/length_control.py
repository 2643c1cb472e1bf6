"""Length control (reinforce_plus_plus.md §7d) as a training term: the soft overlong
punishment and the length penalty added to each response's reward before the estimator
(``shape_rewards``), and the overlong filter, which gives a truncated response advantage 0
after the estimator and every term before it (``shape_advantages``), so it leaves the
policy loss. The formulas are relax/algorithms/length_control.py.

On the training ranks, from the batch they train on: the same whatever collected it (plain
prompts, partial rollouts, ``--fully-async``), and dynamic-sampling filters, which run where
the batch is collected, see the task's rewards.
"""

from __future__ import annotations

import torch

from relax.algorithms.length_control import length_penalty, overlong_penalty
from relax.config.sections import LengthSection
from relax.trainer.terms.term import Term

METRICS = {"overlong": "rollout/overlong_penalty", "length": "rollout/length_penalty",
           "filter": "rollout/overlong_filtered_fraction"}


def response_lengths(rollout) -> torch.Tensor:
    """[B] each response's generated tokens: the ones it attends to beyond the prompt (a
    partial rollout's tokens of earlier steps included, which its loss mask may leave out)."""
    mask = rollout.response_mask if rollout.context_mask is None else rollout.context_mask
    return mask.sum(-1)


class LengthControl(Term):
    """``--overlong-buffer-len``, ``--length-penalty-coef``, ``--overlong-filter`` (§7d);
    metrics ``rollout/overlong_penalty`` and ``rollout/length_penalty`` (the mean term added
    to a response's reward) and ``rollout/overlong_filtered_fraction`` (the share of
    responses left out), over the step's responses, all ranks."""

    def __init__(self, s: LengthSection, max_len: int):
        self.s, self.max_len = s, max_len
        self.truncated: torch.Tensor | None = None  # [B] of this step's batch, for the filter

    @classmethod
    def build(cls, s: LengthSection, max_len: int) -> LengthControl | None:
        return cls(s, max_len) if s.enabled else None

    def shape_rewards(self, rewards: torch.Tensor, batch, tracker) -> torch.Tensor:
        s, n = self.s, len(rewards)
        self.truncated = batch.rollout.truncated
        if not s.shapes_rewards:
            return rewards
        lengths = response_lengths(batch.rollout)
        shaped = rewards
        if s.overlong_buffer_len is not None:
            penalty = overlong_penalty(lengths, max_len=self.max_len,
                                       buffer=s.overlong_buffer_len,
                                       factor=s.overlong_penalty_factor)
            tracker.add_ratio(METRICS["overlong"], penalty.sum(), n)
            shaped = shaped + penalty.to(rewards.dtype)
        if s.length_penalty_coef > 0:
            penalty = length_penalty(lengths, max_len=self.max_len, coef=s.length_penalty_coef)
            tracker.add_ratio(METRICS["length"], penalty.sum(), n)
            shaped = shaped + penalty.to(rewards.dtype)
        return shaped

    def shape_advantages(self, exp, estimate, tracker) -> None:
        if not self.s.overlong_filter:
            return
        out = self.truncated.to(exp.advantages.device)
        tracker.add_ratio(METRICS["filter"], out.sum(), len(out))
        exp.advantages = torch.where(out[:, None], torch.zeros_like(exp.advantages),
                                     exp.advantages)
