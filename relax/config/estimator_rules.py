"""Rules of the estimator's facts (reinforce_plus_plus.md §5a, §5b, §7, §8): the reduction
its objective is defined with, the smallest group, an advantage that must keep the reward's
scale, and the on-policy conditions of a loss without an importance ratio (rloo). Torch-free,
like the rest of validation; asks :mod:`relax.estimators`, never an estimator's name."""

from __future__ import annotations

from relax.config.checks import reject
from relax.errors import ConfigError
from relax.estimators import EstimatorFacts, facts


def check_estimator_rules(cfg) -> None:
    """The reduction, the group size, the normalization and the on-policy rules of the
    estimator's facts; raises :class:`ConfigError` for the first one broken."""
    f = facts(cfg.algorithm.estimator)
    if cfg.algorithm.per_token_loss and not f.per_token_loss:
        reject(cfg, "calculate_per_token_loss", f"{f.name}: the objective is the response "
               "mean (reinforce_plus_plus.md §7); remove --calculate-per-token-loss")
    if cfg.batches.samples_per_prompt < f.min_samples_per_prompt:
        reject(cfg, "n_samples_per_prompt", f"{f.name}: with one response per prompt there is "
               f"no group baseline and every raw advantage would be 0 (reinforce_plus_plus.md "
               f"{f.section}); set --n-samples-per-prompt 8")
    if f.normalization == "none" and cfg.algorithm.normalize_advantages:
        reject(cfg, "normalize_advantages", f"{f.name}: the advantage keeps the reward's scale; "
               "a token whitening would put back the std division it leaves out "
               f"(reinforce_plus_plus.md {f.section}); remove --normalize-advantages")
    if f.requires_per_token_loss and not cfg.algorithm.per_token_loss:
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
    samples = cfg.batches.rollout_batch_size * cfg.batches.samples_per_prompt
    if cfg.batches.steps_per_rollout not in (None, 1):
        reject(cfg, "num_steps_per_rollout", f"{why}, so a second optimizer step would train a "
               "moved policy on the old samples; use 1")
    if cfg.batches.global_batch_size not in (None, samples):
        reject(cfg, "global_batch_size", f"{why}, so one optimizer step must take the whole "
               f"rollout step: --rollout-batch-size x --n-samples-per-prompt = {samples}; "
               "use that or leave it out")
    if cfg.rollout.partial.enabled:
        reject(cfg, "partial_rollout", f"{why}, so it cannot train on tokens an older policy "
               "sampled; remove --partial-rollout")
    if cfg.rollout.off_policy.use_rollout_logprobs:
        reject(cfg, "use_rollout_logprobs", f"{why}, so there is no pi_old to choose; remove "
               "it (--use-tis corrects for the sampler)")
