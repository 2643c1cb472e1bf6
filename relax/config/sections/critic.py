"""The critic section (``cfg.critic``): PPO's learned critic (Relax/slime names;
reinforce_plus_plus.md §5c) and its rules (docs/configuration.md "Critic"). GAE's discount and
lambda are the algorithm's (``cfg.algorithm.gamma``, ``.lambd``). Torch-free, like the rest of
validation: the file of --critic-load is checked here; whether its weights fit the model when
the trainer builds the critic (relax/trainer/terms/critic.py), before any step."""

from __future__ import annotations

import os
from dataclasses import dataclass

from relax.config.section import FLOAT32, Section, option, reject
from relax.config.sections.algorithm import NEEDS_CRITIC

CRITIC_FILE = "critic.pt"
CHECKPOINT_METADATA = ".metadata"  # what DCP writes last into a complete checkpoint


@dataclass(frozen=True)
class CriticSection(Section):
    """PPO's learned critic: GAE, the clipped value loss and the critic's own optimizer
    (reinforce_plus_plus.md §5c)."""

    value_clip: float = option(
        0.2,
        "c >= 0 of PPO's clipped value loss: the critic's new value may move at most c from "
        'its value before the update where that lowers the loss (reinforce_plus_plus.md §5c); '
        'needs --advantage-estimator ppo.',
        bound=(FLOAT32, (lambda v: v >= 0.0, "must be >= 0, e.g. 0.2")),
        requires=NEEDS_CRITIC)
    critic_load: str | None = option(
        None,
        'Start the critic from DIR, a --critic-save directory (its critic.pt) or a checkpoint '
        "directory of a ppo run, instead of the policy's initial weights and a zero value head; "
        'needs --advantage-estimator ppo.',
        default_text="none (the policy's weights)",
        requires=NEEDS_CRITIC)
    critic_save: str | None = option(
        None,
        "At the end of the run, write the critic's weights to DIR/critic.pt (what "
        '--critic-load reads); the critic is also in every checkpoint of --save; needs '
        '--advantage-estimator ppo.',
        writes='critic',
        requires=NEEDS_CRITIC)
    critic_lr: float | None = option(
        None,
        "The critic's AdamW learning rate (> 0); needs --advantage-estimator ppo.",
        default_text='--lr',
        bound=(FLOAT32, (lambda v: v is None or v > 0.0, "must be > 0, e.g. 1e-5")),
        requires=NEEDS_CRITIC)
    critic_lr_warmup_iters: int = option(
        0,
        "Linear warm-up of the critic's learning rate over its first N optimizer steps (0: "
        'none); needs --advantage-estimator ppo.',
        bound=(lambda v: v >= 0, "must be >= 0 (0: none)"),
        requires=NEEDS_CRITIC)
    num_critic_only_steps: int = option(
        0,
        'Train only the critic for the first N rollout steps (the policy stays as it is while '
        'the values become useful); needs --advantage-estimator ppo.',
        bound=(lambda v: v >= 0, "must be >= 0 (0: none)"),
        requires=NEEDS_CRITIC)

    def check(self) -> None:
        if self.critic_load is not None and not any(
                os.path.isfile(os.path.join(self.critic_load, name))
                for name in (CRITIC_FILE, CHECKPOINT_METADATA)):
            reject(self, "critic_load", f"no {CRITIC_FILE} and no checkpoint in it; point it "
                   "at a --critic-save directory or a checkpoint directory "
                   "(DIR/rollout_NNNNNN) of a ppo run")


# ------------------------------------------------------------------ rules across sections

def check_critic_steps(cfg, explicit: set[str]) -> None:
    """Sections critic, batches: the critic-only steps leave some for the policy."""
    steps = cfg.batches.num_rollout
    if steps is not None and cfg.critic.num_critic_only_steps >= steps:
        # the count is of the whole run's rollout steps (a resumed run keeps it), so none
        # would be left for the policy
        reject(cfg, ("num_critic_only_steps", "num_rollout"), "every rollout step would train "
               "only the critic, so the policy would never train; use fewer critic-only steps "
               "than --num-rollout, or more rollout steps")
