"""Which no-grad passes over a rollout a configuration needs before the update: the
reference's (reinforce_plus_plus.md §2, §3, §7) and pi_old's (§7, §7b)."""

from __future__ import annotations

from relax import estimators


def needs_reference(algorithm) -> bool:
    """Reference log-probs only when a KL term reads them (reinforce_plus_plus.md §3 shaping, §7 KL loss)."""
    return estimators.needs_reference(estimators.facts(algorithm.advantage_estimator),
                                      kl_coef=algorithm.kl_coef, use_kl_loss=algorithm.use_kl_loss)


def needs_old_log_probs(algorithm, batches, distillation) -> bool:
    """Whether the rollout step needs its own no-grad pass for pi_old (reinforce_plus_plus.md §7 ratio).

    Not needed when one optimizer step covers the whole rollout (``--num-steps-per-rollout``
    1): every micro-batch of that step runs before ``optimizer.step()``, so the policy of the
    update *is* the policy that pi_old denotes, and ``update.micro_batch_loss`` uses its own
    log-probs, detached (ratio exactly 1, gradient of log pi). Still needed when a later
    optimizer step sees a moved policy, for REINFORCE++ k1 reward shaping, whose returns
    read pi_old before any update (reinforce_plus_plus.md §3), and for on-policy distillation,
    whose advantage term reads it the same way (§7b). ``algorithm``, ``batches``,
    ``distillation``: the configuration's sections.
    """
    f = estimators.facts(algorithm.advantage_estimator)
    return (estimators.returns_read_old_policy(f, kl_coef=algorithm.kl_coef)
            or batches.num_steps_per_rollout > 1
            # the distillation term reads pi_old before any update (§7b); the JSD of
            # --opd-type self reads the update's own forward instead
            or (distillation.use_opd and distillation.opd_type != "self"))
