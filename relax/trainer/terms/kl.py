"""The KL terms against the reference policy (reinforce_plus_plus.md §2, §3, §7): the
reference's no-grad pass that the k1 reward shaping of the estimators (§3, inside
relax/algorithms ``compute_advantages_and_returns``) and the KL loss read, and the KL loss
``loss + kl_loss_coef * L_KL`` (``--use-kl-loss``, the estimator of ``--kl-loss-type``)."""

from __future__ import annotations

from dataclasses import dataclass

from relax.algorithms import approx_kl
from relax.trainer.terms.term import LossView, Term


class Reference(Term):
    """``exp.ref_log_probs`` [B, T] from the policy's reference (relax/trainer/policy/bundle.py:
    a frozen copy, or the LoRA policy with its adapter off), once a rollout step."""

    def __init__(self, policy):
        self.policy = policy

    def before_update(self, exp, batch, passes: dict) -> None:
        exp.ref_log_probs = self.policy.ref_log_probs(exp, **passes)


@dataclass(frozen=True)
class KLLoss(Term):
    """``coef`` * the reduced ``kind`` KL of the policy to the reference (§2 estimators)."""

    coef: float
    kind: str
    metric_names = ("train/kl_loss",)
    keeps_zero_advantage_rows = True

    def add_loss(self, loss, view: LossView, rows):
        kl = view.reduce(approx_kl(view.log_probs, view.mb.ref_log_probs, self.kind,
                                   mask=view.mask))
        return loss + self.coef * kl, [kl]
