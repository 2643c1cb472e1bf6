"""The entropy bonus of the policy loss (reinforce_plus_plus.md §7):
``loss = L_PG - entropy_coef * L_entropy``; ``train/entropy`` is reported whatever the
coefficient."""

from __future__ import annotations

from dataclasses import dataclass

from relax.trainer.terms.term import LossView, Term


@dataclass(frozen=True)
class EntropyBonus(Term):
    """``coef``: ``--entropy-coef`` (0: the metric only, no gradient through the entropy)."""

    coef: float = 0.0
    metric_names = ("train/entropy",)

    @property
    def keeps_zero_advantage_rows(self) -> bool:
        return bool(self.coef)

    def add_loss(self, loss, view: LossView, rows):
        entropy = view.reduce(view.entropy)
        return (loss - self.coef * entropy if self.coef else loss), [entropy]
