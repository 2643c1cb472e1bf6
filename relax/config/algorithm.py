"""The algorithm section: the advantage estimator, the policy loss and the KL terms
(reinforce_plus_plus.md §2-§7). The estimators and losses take this section as it is
(relax/algorithms/); each field carries its flag, default, help and bound. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, option
from relax.estimators import ESTIMATOR_NAMES, KL_KINDS


@dataclass(frozen=True)
class AlgorithmSection(Section):
    """Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7)."""

    estimator: str = option(
        'grpo',
        'The advantage estimator and with it the policy loss (reinforce_plus_plus.md §3-§5b, '
        '7).',
        flag='advantage_estimator',
        choices=ESTIMATOR_NAMES)
    normalize_advantages: bool = option(
        False,
        'REINFORCE++ variants: global masked population normalization, required '
        '(reinforce_plus_plus.md §6, 8). grpo/gspo/sapo/cispo: masked_whiten '
        '(reinforce_plus_plus.md §5); rejected for rloo (§5a).')
    gamma: float = option(
        1.0,
        'Discount of the reward-to-go return, in (0, 1]; only reinforce_plus_plus '
        "(reinforce_plus_plus.md §3) and ppo's GAE (§5c) read it.",
        bound=(lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 (the default)"))
    kl_coef: float = option(
        0.0,
        'Reward-shaping KL coefficient beta >= 0; only reinforce_plus_plus (recipe 0.01, '
        'reinforce_plus_plus.md §3). Must be 0 for the others (reinforce_plus_plus.md §4, 8).',
        bound=(lambda v: v >= 0.0, "must be >= 0; use 0 to turn reward KL shaping off"))
    kl_loss_type: str = option(
        'k1',
        'KL estimator of --use-kl-loss (reinforce_plus_plus.md §2), inert without it; '
        "reinforce_plus_plus requires k1 (reward shaping), reinforce_plus_plus_baseline's KL "
        'loss k2 (reinforce_plus_plus.md §8).',
        choices=KL_KINDS)
    use_kl_loss: bool = option(
        False,
        'Add the separate reference KL loss (reinforce_plus_plus.md §7); rejected for '
        'reinforce_plus_plus (reinforce_plus_plus.md §8).')
    kl_loss_coef: float = option(
        0.0,
        'Weight of the KL loss, >= 0, needs --use-kl-loss; never nonzero together with '
        '--kl-coef (reinforce_plus_plus.md §7, 8).',
        bound=(lambda v: v >= 0.0, "must be >= 0; use 0 to turn the KL loss off"))
    entropy_coef: float = option(
        0.0,
        'Entropy bonus weight, >= 0: loss -= coef * entropy (reinforce_plus_plus.md §7).',
        bound=(lambda v: v >= 0.0, "must be >= 0; use 0 to turn the entropy bonus off"))
    eps_clip: float = option(
        0.2,
        "Lower PPO clip eps_low, in (0, 1) (reinforce_plus_plus.md §7); cispo: its weight's "
        'floor 1 - eps_low for A < 0 (§5b); not for sapo or rloo.',
        bound=(lambda v: 0.0 < v < 1.0, "must lie in (0, 1); the usual value is 0.2"))
    eps_clip_high: float | None = option(
        None,
        "Upper PPO clip eps_high > 0 (reinforce_plus_plus.md §7); cispo: its weight's cap 1 + "
        'eps_high for A >= 0 (§5b); not for sapo or rloo.',
        default_text='--eps-clip',
        bound=(lambda v: v is None or v > 0.0, "must be > 0, e.g. 0.28"))
    eps_clip_c: float | None = option(
        None,
        'Dual-clip bound c > 1 for negative advantages (reinforce_plus_plus.md §7); grpo and '
        'the REINFORCE++ variants only.',
        default_text='off',
        bound=(lambda v: v is None or v > 1.0, "the dual-clip bound must be > 1, e.g. 3.0"))
    sapo_tau_pos: float = option(
        1.0,
        'SAPO gate temperature for A > 0 (reinforce_plus_plus.md §7); sapo only.',
        bound=(lambda v: v > 0.0, "must be > 0; the default is 1.0"))
    sapo_tau_neg: float = option(
        1.05,
        'SAPO gate temperature for A <= 0 (reinforce_plus_plus.md §7); sapo only.',
        bound=(lambda v: v > 0.0, "must be > 0; the default is 1.05"))
    lambd: float = option(
        1.0,
        'The GAE lambda in [0, 1]; only --advantage-estimator ppo reads it '
        '(reinforce_plus_plus.md §5c); its rules: relax/config/critic_rules.py.')
    disable_std_normalization: bool = option(
        False,
        'grpo/gspo/sapo/cispo: do not divide the group-centred reward by the group std '
        '(reinforce_plus_plus.md §5).',
        flag='disable_grpo_std_normalization')
    per_token_loss: bool = option(
        False,
        'grpo/gspo/sapo: global token-mean reduction; required for rloo and cispo (§5a, §5b); '
        'rejected for the REINFORCE++ variants (reinforce_plus_plus.md §7, 8).',
        flag='calculate_per_token_loss',
        default_note='response mean')
    custom_advantage_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' replacing the advantage of "
        'grpo/gspo/sapo/cispo/rloo; rejected for the REINFORCE++ variants '
        '(reinforce_plus_plus.md §8).',
        flag='custom_advantage_function_path')
    reward_post_process_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' post-processing rewards; rejected for "
        'reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).',
        flag='custom_reward_post_process_path')
