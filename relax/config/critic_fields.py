"""The flags of PPO's learned critic (Relax/slime names; reinforce_plus_plus.md §5c), a base
of :class:`~relax.config.schema.TrainConfig` so the schema module stays readable; rules:
relax/config/critic_rules.py. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from relax.config.fields import option
from relax.config.sections import Section, flag


@dataclass(frozen=True)
class CriticSection(Section):
    """What the critic and GAE read (``cfg.critic``)."""

    gamma: float = flag("gamma")
    lambd: float = flag("lambd")
    value_clip: float = flag("value_clip")
    load: str | None = flag("critic_load")
    save: str | None = flag("critic_save")
    lr: float | None = flag("critic_lr")
    lr_warmup_iters: int = flag("critic_lr_warmup_iters")
    num_critic_only_steps: int = flag("num_critic_only_steps")


@dataclass(frozen=True)
class CriticFields:
    lambd: float = option(
        1.0, "The GAE lambda in [0, 1]; only --advantage-estimator ppo reads it "
        "(reinforce_plus_plus.md §5c).", group="critic")
    value_clip: float = option(
        0.2, "c >= 0 of PPO's clipped value loss: the critic's new value may move at most c "
        "from its value before the update where that lowers the loss "
        "(reinforce_plus_plus.md §5c); needs --advantage-estimator ppo.", group="critic")
    critic_load: str | None = option(
        None, "Start the critic from DIR, a --critic-save directory (its critic.pt) or a "
        "checkpoint directory of a ppo run, instead of the policy's initial weights and a "
        "zero value head; needs --advantage-estimator ppo.", default_text="none (the policy's weights)",
        group="critic")
    critic_save: str | None = option(
        None, "At the end of the run, write the critic's weights to DIR/critic.pt (what "
        "--critic-load reads); the critic is also in every checkpoint of --save; needs "
        "--advantage-estimator ppo.", group="critic")
    critic_lr: float | None = option(
        None, "The critic's AdamW learning rate (> 0); needs --advantage-estimator ppo.",
        default_text="--lr", group="critic")
    critic_lr_warmup_iters: int = option(
        0, "Linear warm-up of the critic's learning rate over its first N optimizer steps "
        "(0: none); needs --advantage-estimator ppo.", group="critic")
    num_critic_only_steps: int = option(
        0, "Train only the critic for the first N rollout steps (the policy stays as it is "
        "while the values become useful); needs --advantage-estimator ppo.", group="critic")

    @cached_property
    def critic(self) -> CriticSection:
        return CriticSection.of(self)
