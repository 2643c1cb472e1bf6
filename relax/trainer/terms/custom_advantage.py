"""``--custom-advantage-function-path``: a plug-in's advantages replace the estimator's
(grpo, gspo, sapo, rloo, cispo; rejected for the REINFORCE++ variants and ppo,
reinforce_plus_plus.md §3, §4, §5c, §8; docs/configuration.md), before any distillation term
(§7b)."""

from __future__ import annotations

import torch

from relax.plugins import call_plugin, load_function
from relax.rollout.reward.scoring import plugin_tensor
from relax.trainer.terms.term import Term

FLAG = "--custom-advantage-function-path"


class CustomAdvantage(Term):
    """``fn(rewards [B], group_index [B], mask [B, T]) -> advantages [B, T]`` over this rank's
    rows, checked, 0 off the mask."""

    def __init__(self, fn):
        self.fn = fn

    @classmethod
    def load(cls, path: str | None) -> CustomAdvantage | None:
        """The plug-in at ``path``, or None without the flag."""
        return cls(load_function(path, FLAG)) if path else None

    def shape_advantages(self, exp, estimate, tracker) -> None:
        mask = exp.response_mask
        returned = call_plugin(self.fn, FLAG, estimate.rewards, estimate.group_index, mask)
        adv = plugin_tensor(returned, FLAG, "advantages", mask.shape, device=mask.device)
        exp.advantages = torch.where(mask, adv, 0.0)
