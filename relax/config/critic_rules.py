"""Rules of the critic flags (reinforce_plus_plus.md §5c, docs/configuration.md "Critic").
Torch-free, like the rest of validation: the file of --critic-load is checked here; whether
its weights fit the model when the trainer builds the critic (relax/trainer/critic.py), before
any step."""

from __future__ import annotations

import os

from relax.config.checks import reject
from relax.config.section import value_of
from relax.estimators import facts

_CRITIC_FLAGS = ("lambd", "value_clip", "critic_load", "critic_save", "critic_lr",
                 "critic_lr_warmup_iters", "num_critic_only_steps")
CRITIC_FILE = "critic.pt"
CHECKPOINT_METADATA = ".metadata"  # what DCP writes last into a complete checkpoint


def check_critic(cfg, explicit: set[str]) -> None:
    if not facts(cfg.algorithm.estimator).needs_critic:
        for dest in _CRITIC_FLAGS:
            if dest in explicit:
                reject(cfg, dest, "has no effect without a critic; it needs "
                       "--advantage-estimator ppo")
        return
    if not 0.0 <= cfg.algorithm.lambd <= 1.0:
        reject(cfg, "lambd", "must lie in [0, 1]; 1.0 (the default) is the Monte-Carlo return")
    if not cfg.critic.value_clip >= 0.0:
        reject(cfg, "value_clip", "must be >= 0, e.g. 0.2")
    if cfg.critic.lr is not None and not cfg.critic.lr > 0.0:
        reject(cfg, "critic_lr", "must be > 0, e.g. 1e-5")
    for dest in ("critic_lr_warmup_iters", "num_critic_only_steps"):
        if value_of(cfg, dest) < 0:
            reject(cfg, dest, "must be >= 0 (0: none)")
    steps = cfg.batches.num_rollout
    if steps is not None and cfg.critic.num_critic_only_steps >= steps:
        # the count is of the whole run's rollout steps (a resumed run keeps it), so none
        # would be left for the policy
        reject(cfg, ("num_critic_only_steps", "num_rollout"), "every rollout step would train "
               "only the critic, so the policy would never train; use fewer critic-only steps "
               "than --num-rollout, or more rollout steps")
    if cfg.critic.load is not None and not any(
            os.path.isfile(os.path.join(cfg.critic.load, name))
            for name in (CRITIC_FILE, CHECKPOINT_METADATA)):
        reject(cfg, "critic_load", f"no {CRITIC_FILE} and no checkpoint in it; point it at a "
               "--critic-save directory or a checkpoint directory (DIR/rollout_NNNNNN) of a "
               "ppo run")

