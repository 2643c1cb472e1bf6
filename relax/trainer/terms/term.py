"""The training-term protocol: every optional part of a rollout step's training is a
:class:`Term`, and the loop (relax/trainer/loop.py) and the update (relax/trainer/policy/update.py)
call each hook of every configured term in order, with no branch on which terms are there.

A term may, in the order of a rollout step (reinforce_plus_plus.md §9):

    before_update(exp, batch, passes)   a no-grad pass over the rollout: the reference's
                                        log-probs (§2, §3, §7; kl.py), the teacher's (§7b;
                                        distillation.py), the critic's V_old (§5c; critic.py)
    shape_rewards(rewards, batch, tracker) -> rewards
                                        the rewards [B] the estimator reads, changed: the
                                        length controls (§7d; length_control.py)
    shape_advantages(exp, estimate, tracker)
                                        change exp.advantages after the estimator and its
                                        normalization (§6): the critic's targets (§5c), the
                                        custom plug-in, the distillation term (§7b)
    train(exp, tracker, plan) -> bool   optimizer steps of its own before the policy's (the
                                        critic, §5c); True: the policy waits this step
    after_update(tracker)               the step's metrics it gathered in the update (§7a)

and, inside the update's loss of one micro-batch (§7, ``micro_batch_loss``):

    student_rows(rows, mb)              read the student's forward (under its autocast), e.g.
                                        the self-distillation JSD (§7b "Self mode")
    correct(pg, view) -> (pg, stats)    a per-token factor on the policy loss (§7a: TIS, OPSM)
    observe(view)                       read the pass without changing the loss (§7a mismatch)
    add_loss(loss, view, rows) -> (loss, stats)
                                        its share of the loss: entropy bonus and KL loss (§7),
                                        the clipped JSD (§7b); ``rows`` is what its
                                        ``student_rows`` returned

``metric_names`` name the stats a term returns from ``correct`` and ``add_loss``, in order;
the update's metrics vector is the policy loss's own, then each term's, in term order.
``keeps_zero_advantage_rows``: the term adds a loss or gradient to a response whose advantages
are all 0, so such rows cannot skip the backward (``update.inert_rows``).

A term also owns its state: ``checkpoint_state()`` (entries of the policy's DCP checkpoint),
``load(folder)`` on resume, ``finish()`` when the run's steps are done, ``close()`` for what
it owns outside the process (a teacher server). Every hook does nothing by default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from relax.trainer.policy.experience import Experience


@dataclass(frozen=True)
class Estimate:
    """What the estimator read and gave this step (reinforce_plus_plus.md §3-§6): this rank's
    ``rewards`` [B] and ``group_index`` [B], and ``returns`` [B, T] (ppo: the raw GAE, §5c)."""

    rewards: torch.Tensor
    group_index: torch.Tensor | None
    returns: torch.Tensor


@dataclass(frozen=True)
class UpdatePlan:
    """How a term's own optimizer steps cut the rollout (:meth:`Term.train`): the policy's
    ``global_batch_size`` (as many steps as ``--num-steps-per-rollout``, §7), its
    ``micro_batch_size`` and token budget, and the policy's optimizer (a term that keeps the
    policy waiting gives it its state, relax/trainer/terms/critic.py ``hold_still``)."""

    global_batch_size: int
    micro_batch_size: int
    max_tokens: int | None
    policy_optimizer: torch.optim.Optimizer


@dataclass(frozen=True)
class LossView:
    """What a term's loss hooks read of one micro-batch (reinforce_plus_plus.md §7): ``mb``
    the micro-batch, [B, T] ``log_probs`` (with grad) and ``entropy`` of the student's
    forward, ``trainer_old`` (the trainer's pi_old, §7a) and ``old_log_probs`` (pi_old of the
    ratio), and ``reduce`` ([B, T] -> the step's global scalar, the policy loss's reduction)."""

    mb: Experience
    log_probs: torch.Tensor
    entropy: torch.Tensor
    trainer_old: torch.Tensor
    old_log_probs: torch.Tensor
    reduce: Callable[[torch.Tensor], torch.Tensor]

    @property
    def mask(self) -> torch.Tensor:
        return self.mb.response_mask


class Term:
    """One training term; see the module docstring. Every hook does nothing by default."""

    metric_names: tuple[str, ...] = ()
    keeps_zero_advantage_rows: bool = False

    # ------------------------------------------------------------------ the rollout step
    def before_update(self, exp, batch, passes: dict) -> None:
        """A no-grad pass over ``exp`` (``passes``: relax/trainer/policy/logprobs.py
        ``batched_log_probs`` micro-batching); ``batch`` the rollout step's StepBatch."""

    def shape_rewards(self, rewards: torch.Tensor, batch, tracker) -> torch.Tensor:
        """The rewards [B] of ``batch`` (the rollout step's StepBatch) as the estimator
        should read them."""
        return rewards

    def shape_advantages(self, exp, estimate: Estimate, tracker) -> None:
        """Change ``exp.advantages`` [B, T] after the estimator (``estimate``)."""

    def train(self, exp, tracker, plan: UpdatePlan) -> bool:
        """Optimizer steps of the term's own; True when the policy skips this step."""
        return False

    def after_update(self, tracker) -> None:
        """The step's metrics the term gathered during the policy's update."""

    # ------------------------------------------------------------------ the loss
    def student_rows(self, rows, mb):
        """Read the student's forward of ``mb`` (relax/trainer/policy/logprobs.py ``ResponseRows``)."""
        return None

    def correct(self, pg: torch.Tensor, view: LossView):
        """The per-token policy loss [B, T] with the term's factor, and its stats."""
        return pg, []

    def observe(self, view: LossView) -> None:
        """Read the micro-batch's pass."""

    def add_loss(self, loss: torch.Tensor, view: LossView, rows):
        """``loss`` with the term's share added, and its stats."""
        return loss, []

    # ------------------------------------------------------------------ state
    def checkpoint_state(self) -> dict:
        """This rank's entries of the DCP checkpoint, beside the policy's."""
        return {}

    def load(self, folder: str) -> None:
        """Restore :meth:`checkpoint_state` from the checkpoint ``folder``."""

    def finish(self) -> None:
        """The run's steps are done (final files of the term's own)."""

    def close(self) -> None:
        """End what the term owns outside the process."""
