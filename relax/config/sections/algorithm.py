"""The algorithm section: the advantage estimator, the policy loss and the KL terms
(reinforce_plus_plus.md §2-§7), and their rules. The estimators and losses take this section
as it is (relax/algorithms/); each field carries its flag, default, help and bound. The rules
ask the estimator's facts (:mod:`relax.estimators`), never its name. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.checks import check_custom_path
from relax.config.section import FLOAT32, Needs, Section, flag_of, option, reject, value_of
from relax.errors import ConfigError
from relax.estimators import ESTIMATOR_NAMES, KL_KINDS, LOSS_FLAGS, EstimatorFacts, facts


def _has_critic(cfg) -> bool:
    return facts(cfg.algorithm.advantage_estimator).needs_critic


# a flag that only the learned critic reads (cfg.critic's too)
NEEDS_CRITIC = Needs(_has_critic, "has no effect without a critic; it needs "
                     "--advantage-estimator ppo")


@dataclass(frozen=True)
class AlgorithmSection(Section):
    """Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7)."""

    advantage_estimator: str = option(
        'grpo',
        'The advantage estimator and with it the policy loss (reinforce_plus_plus.md §3-§5b, '
        '7).',
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
        bound=((lambda v: 0.0 < v <= 1.0, "must lie in (0, 1]; use 1.0 (the default)"), FLOAT32))
    kl_coef: float = option(
        0.0,
        'Reward-shaping KL coefficient beta >= 0; only reinforce_plus_plus (recipe 0.01, '
        'reinforce_plus_plus.md §3). Must be 0 for the others (reinforce_plus_plus.md §4, 8).',
        bound=((lambda v: v >= 0.0, "must be >= 0; use 0 to turn reward KL shaping off"), FLOAT32))
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
        bound=((lambda v: v >= 0.0, "must be >= 0; use 0 to turn the KL loss off"), FLOAT32))
    entropy_coef: float = option(
        0.0,
        'Entropy bonus weight, >= 0: loss -= coef * entropy (reinforce_plus_plus.md §7).',
        bound=((lambda v: v >= 0.0, "must be >= 0; use 0 to turn the entropy bonus off"), FLOAT32))
    eps_clip: float = option(
        0.2,
        "Lower PPO clip eps_low, in (0, 1) (reinforce_plus_plus.md §7); cispo: its weight's "
        'floor 1 - eps_low for A < 0 (§5b); not for sapo or rloo.',
        bound=((lambda v: 0.0 < v < 1.0, "must lie in (0, 1); the usual value is 0.2"), FLOAT32))
    eps_clip_high: float | None = option(
        None,
        "Upper PPO clip eps_high > 0 (reinforce_plus_plus.md §7); cispo: its weight's cap 1 + "
        'eps_high for A >= 0 (§5b); not for sapo or rloo.',
        default_text='--eps-clip',
        bound=((lambda v: v is None or v > 0.0, "must be > 0, e.g. 0.28"), FLOAT32),
        follows='eps_clip')
    eps_clip_c: float | None = option(
        None,
        'Dual-clip bound c > 1 for negative advantages (reinforce_plus_plus.md §7); grpo and '
        'the REINFORCE++ variants only.',
        default_text='off',
        bound=((lambda v: v is None or v > 1.0, "the dual-clip bound must be > 1, e.g. 3.0"),
               FLOAT32))
    sapo_tau_pos: float = option(
        1.0,
        'SAPO gate temperature for A > 0 (reinforce_plus_plus.md §7); sapo only.',
        bound=((lambda v: v > 0.0, "must be > 0; the default is 1.0"), FLOAT32))
    sapo_tau_neg: float = option(
        1.05,
        'SAPO gate temperature for A <= 0 (reinforce_plus_plus.md §7); sapo only.',
        bound=((lambda v: v > 0.0, "must be > 0; the default is 1.05"), FLOAT32))
    lambd: float = option(
        1.0,
        'The GAE lambda in [0, 1]; only --advantage-estimator ppo reads it '
        '(reinforce_plus_plus.md §5c).',
        bound=(lambda v: 0.0 <= v <= 1.0, "must lie in [0, 1]; 1.0 (the default) is the "
               "Monte-Carlo return"),
        requires=NEEDS_CRITIC)
    disable_grpo_std_normalization: bool = option(
        False,
        'grpo/gspo/sapo/cispo: do not divide the group-centred reward by the group std '
        '(reinforce_plus_plus.md §5).')
    calculate_per_token_loss: bool = option(
        False,
        'grpo/gspo/sapo: global token-mean reduction; required for rloo and cispo (§5a, §5b); '
        'rejected for the REINFORCE++ variants (reinforce_plus_plus.md §7, 8).',
        default_note='response mean')
    custom_advantage_function_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' replacing the advantage of "
        'grpo/gspo/sapo/cispo/rloo; rejected for the REINFORCE++ variants '
        '(reinforce_plus_plus.md §8).')
    custom_reward_post_process_path: str | None = option(
        None,
        "'module:function' or 'file.py:function' post-processing rewards; rejected for "
        'reinforce_plus_plus_baseline (reinforce_plus_plus.md §8).')
    moe_aux_loss_coef: float = option(
        0.0,
        "Weight of a mixture-of-experts policy's load-balancing loss, >= 0: loss += coef * the "
        'sum over MoE layers of (E / k) sum_e f_e P_e (Megatron-LM\'s normalization; '
        'docs/moe.md); 0: no router loss (the model\'s own is never used); rejected for a '
        'dense model.',
        bound=((lambda v: v >= 0.0, "must be >= 0; use 0 to leave the router loss out"),
               FLOAT32))

    def check(self) -> None:
        """The KL terms, then the flags the estimator would ignore (rejected rather than
        silently dropped)."""
        _check_kl(self)
        _check_ignored(self)
        for dest in ("custom_advantage_function_path", "custom_reward_post_process_path"):
            check_custom_path(self, dest)


def _check_kl(a: AlgorithmSection) -> None:
    f = facts(a.advantage_estimator)
    if a.kl_coef != 0 and a.kl_loss_coef != 0:
        reject(a, ("kl_coef", "kl_loss_coef"),
               "two reference-KL penalties at once; keep one (reward shaping --kl-coef for "
               "reinforce_plus_plus, the loss --use-kl-loss --kl-loss-coef otherwise) and set "
               "the other to 0")
    if f.kl_in_reward and not f.kl_loss_types:
        # the reward's KL is frozen to signed k1 and there is no second KL loss
        if a.kl_loss_type != "k1":
            reject(a, "kl_loss_type", f"{f.name}: the reward KL estimator is frozen to signed "
                   f"k1 (reinforce_plus_plus.md {f.section}); set --kl-loss-type k1")
        for dest in ("use_kl_loss", "kl_loss_coef"):
            if value_of(a, dest):
                reject(a, dest, f"{f.name} has no second KL loss, KL enters only through the "
                       f"reward (reinforce_plus_plus.md {f.section}); remove {flag_of(dest)} "
                       "and use --kl-coef")
        return
    if a.kl_coef != 0:
        if f.frozen:
            reject(a, "kl_coef", f"{f.name}: KL never enters the advantage "
                   f"(reinforce_plus_plus.md {f.section}); set --kl-coef 0 and use --use-kl-loss "
                   f"--kl-loss-type {f.kl_loss_types[0]} --kl-loss-coef 0.01")
        reject(a, "kl_coef", f"{f.name} has no reward KL shaping (only reinforce_plus_plus "
               "does); set --kl-coef 0 and use --use-kl-loss --kl-loss-coef instead")
    if a.use_kl_loss and a.kl_loss_type not in f.kl_loss_types:
        reject(a, ("use_kl_loss", "kl_loss_type"), f"{f.name}'s KL loss is the "
               f"{' / '.join(f.kl_loss_types)} penalty (reinforce_plus_plus.md {f.section}); "
               f"set --kl-loss-type {f.kl_loss_types[0]}")
    if not a.use_kl_loss and a.kl_loss_coef > 0:
        # --kl-loss-type alone is inert (valid upstream); a coefficient alone is a mistake
        reject(a, "kl_loss_coef", "has no effect without --use-kl-loss; add --use-kl-loss or "
               "set --kl-loss-coef 0")


def _check_ignored(a: AlgorithmSection) -> None:
    """Reject flags the estimator would ignore (its facts say what it reads)."""
    f = facts(a.advantage_estimator)
    if a.custom_reward_post_process_path is not None and not f.custom_reward_post_process:
        reject(a, "custom_reward_post_process_path", f"{f.name}: it would bypass the frozen "
               f"group-mean baseline semantics (reinforce_plus_plus.md {f.section}, 8); remove "
               "--custom-reward-post-process-path")
    if a.custom_advantage_function_path is not None and not f.custom_advantage:
        what = ("group-mean baseline semantics" if f.needs_group_index
                else "reward-to-go advantage")
        reject(a, "custom_advantage_function_path", f"{f.name}: it would replace the frozen "
               f"{what} (reinforce_plus_plus.md {f.section}); remove "
               "--custom-advantage-function-path")
    if a.disable_grpo_std_normalization and not f.reads_std_normalization:
        reject(a, "disable_grpo_std_normalization", f"{f.name} never divides by a group "
               f"std (reinforce_plus_plus.md {f.section}); remove it")
    defaults = AlgorithmSection()
    if not f.reads_gamma and a.gamma != defaults.gamma:
        reject(a, "gamma", f"{f.name} has no per-token discounted return, only "
               "reinforce_plus_plus and ppo read --gamma (reinforce_plus_plus.md §3, §5c); set "
               "--gamma 1.0")
    read = LOSS_FLAGS[f.policy_loss]
    for dest in sorted({d for flags in LOSS_FLAGS.values() for d in flags} - set(read)):
        if value_of(a, dest) != value_of(defaults, dest):
            reject(a, dest, f"{f.name}'s {f.policy_loss} loss does not read it "
                   f"(reinforce_plus_plus.md §7); remove it")


# ------------------------------------------------------------------ rules across sections

def check_modes(cfg, explicit: set[str]) -> None:
    """Sections algorithm, placement, system: the modes no estimator implements, and what the
    frozen REINFORCE++ variants need (reinforce_plus_plus.md §6, 8, 9)."""
    f = facts(cfg.algorithm.advantage_estimator)
    if cfg.placement.fully_async and f.frozen:
        reject(cfg, "fully_async", f"{f.name}: the global normalization needs a closed "
               "synchronous global batch (reinforce_plus_plus.md §6, 8); remove --fully-async")
    if cfg.system.context_parallel_size != 1:
        why = (f"{f.name}: the normalization and the response-mean reduction are defined for "
               "whole sequences per rank (reinforce_plus_plus.md §8, 9)" if f.frozen else
               "context parallelism is not implemented")
        reject(cfg, "context_parallel_size", f"{why}; set --context-parallel-size 1")
    if f.frozen and not cfg.algorithm.normalize_advantages:
        raise ConfigError(f"--advantage-estimator {f.name}", "requires --normalize-advantages "
                          "(the global token normalization of reinforce_plus_plus.md §6 is part "
                          "of the estimator); add --normalize-advantages")


def check_estimator_facts(cfg, explicit: set[str]) -> None:
    """Sections algorithm, batches, rollout.partial, rollout.off_policy: the reduction, the
    group size, the normalization and the on-policy rules of the estimator's facts
    (reinforce_plus_plus.md §5a, §5b, §7, §8)."""
    f = facts(cfg.algorithm.advantage_estimator)
    if cfg.algorithm.calculate_per_token_loss and not f.per_token_loss:
        reject(cfg, "calculate_per_token_loss", f"{f.name}: the objective is the response "
               "mean (reinforce_plus_plus.md §7); remove --calculate-per-token-loss")
    if cfg.batches.n_samples_per_prompt < f.min_samples_per_prompt:
        reject(cfg, "n_samples_per_prompt", f"{f.name}: with one response per prompt there is "
               f"no group baseline and every raw advantage would be 0 (reinforce_plus_plus.md "
               f"{f.section}); set --n-samples-per-prompt 8")
    if f.normalization == "none" and cfg.algorithm.normalize_advantages:
        reject(cfg, "normalize_advantages", f"{f.name}: the advantage keeps the reward's scale; "
               "a token whitening would put back the std division it leaves out "
               f"(reinforce_plus_plus.md {f.section}); remove --normalize-advantages")
    if f.requires_per_token_loss and not cfg.algorithm.calculate_per_token_loss:
        raise ConfigError(f"--advantage-estimator {f.name}", "requires "
                          "--calculate-per-token-loss (its objective is the global token mean; "
                          "a response mean would weight each token by 1/length, "
                          f"reinforce_plus_plus.md {f.section}); add --calculate-per-token-loss")
    if f.on_policy_only:
        _check_on_policy(cfg, f)


def _check_on_policy(cfg, f: EstimatorFacts) -> None:
    """One optimizer step per rollout step, on tokens the current policy sampled: the loss has
    no importance ratio to correct for a policy that moved."""
    why = f"{f.name}'s loss has no importance ratio (reinforce_plus_plus.md {f.section})"
    samples = cfg.batches.rollout_batch_size * cfg.batches.n_samples_per_prompt
    if cfg.batches.num_steps_per_rollout not in (None, 1):
        reject(cfg, "num_steps_per_rollout", f"{why}, so a second optimizer step would train a "
               "moved policy on the old samples; use 1")
    if cfg.batches.global_batch_size not in (None, samples):
        reject(cfg, "global_batch_size", f"{why}, so one optimizer step must take the whole "
               f"rollout step: --rollout-batch-size x --n-samples-per-prompt = {samples}; "
               "use that or leave it out")
    if cfg.rollout.partial.partial_rollout:
        reject(cfg, "partial_rollout", f"{why}, so it cannot train on tokens an older policy "
               "sampled; remove --partial-rollout")
    if cfg.rollout.off_policy.use_rollout_logprobs:
        reject(cfg, "use_rollout_logprobs", f"{why}, so there is no pi_old to choose; remove "
               "it (--use-tis corrects for the sampler)")
