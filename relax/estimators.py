"""What each advantage estimator is: the facts configuration, setup and the algorithm
dispatcher ask instead of branching on names (reinforce_plus_plus.md §3-§8).

Torch-free on purpose: ``relax train`` validates a configuration against these facts before
torch is imported. :mod:`relax.algorithms.registry` pairs every row with its pure functions;
adding an estimator is one row here, one row there, and those functions.
"""

from __future__ import annotations

from dataclasses import dataclass

KL_KINDS: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")

# The configuration fields each policy loss reads (reinforce_plus_plus.md §7).
LOSS_FLAGS: dict[str, tuple[str, ...]] = {
    "ppo_clip": ("eps_clip", "eps_clip_high", "eps_clip_c"),
    "gspo": ("eps_clip", "eps_clip_high"),
    "sapo": ("sapo_tau_pos", "sapo_tau_neg"),
    "cispo": ("eps_clip", "eps_clip_high"),
    "rloo": (),
}


@dataclass(frozen=True)
class EstimatorFacts:
    name: str
    section: str  # where reinforce_plus_plus.md defines it
    policy_loss: str  # a key of LOSS_FLAGS
    # "population": always, part of the estimator (§6); "whiten": on --normalize-advantages (§5);
    # "none": never, --normalize-advantages is rejected (§5a: the advantage keeps the reward scale)
    normalization: str
    kl_in_reward: bool = False  # reads --kl-coef: signed k1 reward shaping (§3)
    kl_loss_types: tuple[str, ...] = KL_KINDS  # allowed with --use-kl-loss; () = no KL loss
    reads_gamma: bool = False  # per-token discounted returns (§3)
    needs_group_index: bool = True  # group statistics over the samples of a prompt
    reads_std_normalization: bool = False  # --disable-grpo-std-normalization
    per_token_loss: bool = True  # may use --calculate-per-token-loss instead of §7's mean
    requires_per_token_loss: bool = False  # the objective is the global token mean (§5a, §5b)
    # no importance ratio in the loss: one optimizer step per rollout, on tokens this policy
    # sampled (§5a)
    on_policy_only: bool = False
    custom_advantage: bool = True  # may replace the advantage (--custom-advantage-function-path)
    custom_reward_post_process: bool = True  # --custom-reward-post-process-path
    min_samples_per_prompt: int = 1
    needs_critic: bool = False  # token values of a learned critic; GAE with --lambd (§5c)

    @property
    def frozen(self) -> bool:
        """Frozen numerics (the REINFORCE++ variants): the normalization is part of it."""
        return self.normalization == "population"


FACTS: dict[str, EstimatorFacts] = {
    f.name: f
    for f in (
        EstimatorFacts("reinforce_plus_plus", "§3", "ppo_clip", "population", kl_in_reward=True,
                       kl_loss_types=(), reads_gamma=True, needs_group_index=False,
                       per_token_loss=False, custom_advantage=False),
        EstimatorFacts("reinforce_plus_plus_baseline", "§4", "ppo_clip", "population",
                       kl_loss_types=("k2",), per_token_loss=False, custom_advantage=False,
                       custom_reward_post_process=False, min_samples_per_prompt=2),
        EstimatorFacts("grpo", "§5", "ppo_clip", "whiten", reads_std_normalization=True),
        EstimatorFacts("gspo", "§5", "gspo", "whiten", reads_std_normalization=True),
        EstimatorFacts("sapo", "§5", "sapo", "whiten", reads_std_normalization=True),
        EstimatorFacts("rloo", "§5a", "rloo", "none", requires_per_token_loss=True,
                       on_policy_only=True, min_samples_per_prompt=2),
        EstimatorFacts("cispo", "§5b", "cispo", "whiten", reads_std_normalization=True,
                       requires_per_token_loss=True),
        EstimatorFacts("ppo", "§5c", "ppo_clip", "whiten", reads_gamma=True,
                       needs_group_index=False, custom_advantage=False, needs_critic=True),
    )
}
ESTIMATOR_NAMES: tuple[str, ...] = tuple(FACTS)


def facts(name: str) -> EstimatorFacts:
    """The facts of estimator ``name``; an unknown name lists the valid ones."""
    try:
        return FACTS[name]
    except KeyError:
        raise ValueError(
            f"estimator={name!r} is unknown; valid estimators: {', '.join(FACTS)}"
        ) from None


def needs_reference(f: EstimatorFacts, *, kl_coef: float, use_kl_loss: bool) -> bool:
    """Reference log-probs are computed only when a KL term reads them (§3 shaping, §7 loss)."""
    return (f.kl_in_reward and kl_coef > 0) or use_kl_loss


def returns_read_old_policy(f: EstimatorFacts, *, kl_coef: float) -> bool:
    """Whether the advantages read pi_old before any update (§3: the k1 reward shaping)."""
    return f.kl_in_reward and kl_coef > 0
