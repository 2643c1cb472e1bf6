"""The critic section (``cfg.critic``): PPO's learned critic (Relax/slime names;
reinforce_plus_plus.md §5c). GAE's discount and lambda are the algorithm's (``cfg.algorithm.gamma``, ``.lambd``).
Rules: relax/config/critic_rules.py. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option


@dataclass(frozen=True)
class CriticSection(Section):
    """PPO's learned critic: GAE, the clipped value loss and the critic's own optimizer
    (reinforce_plus_plus.md §5c)."""

    value_clip: float = option(
        0.2,
        "c >= 0 of PPO's clipped value loss: the critic's new value may move at most c from "
        'its value before the update where that lowers the loss (reinforce_plus_plus.md §5c); '
        'needs --advantage-estimator ppo.')
    load: str | None = option(
        None,
        'Start the critic from DIR, a --critic-save directory (its critic.pt) or a checkpoint '
        "directory of a ppo run, instead of the policy's initial weights and a zero value head; "
        'needs --advantage-estimator ppo.',
        flag='critic_load',
        default_text="none (the policy's weights)")
    save: str | None = option(
        None,
        "At the end of the run, write the critic's weights to DIR/critic.pt (what "
        '--critic-load reads); the critic is also in every checkpoint of --save; needs '
        '--advantage-estimator ppo.',
        flag='critic_save', writes='critic')
    lr: float | None = option(
        None,
        "The critic's AdamW learning rate (> 0); needs --advantage-estimator ppo.",
        flag='critic_lr',
        default_text='--lr')
    lr_warmup_iters: int = option(
        0,
        "Linear warm-up of the critic's learning rate over its first N optimizer steps (0: "
        'none); needs --advantage-estimator ppo.',
        flag='critic_lr_warmup_iters')
    num_critic_only_steps: int = option(
        0,
        'Train only the critic for the first N rollout steps (the policy stays as it is while '
        'the values become useful); needs --advantage-estimator ppo.')
