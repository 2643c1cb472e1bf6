"""Rules of the off-policy flags (reinforce_plus_plus.md §7a): the clips of ``--use-tis``, the
threshold of ``--use-opsm``, partial rollouts, and the flags that need one of them. Torch-free,
like the rest of validation."""

from __future__ import annotations

from relax.config.checks import check_custom_path, reject
from relax.config.section import value_of

# flag -> the switch it needs
_NEEDS = {"tis_clip": "use_tis", "tis_clip_low": "use_tis",
          "custom_tis_function_path": "use_tis", "opsm_delta": "use_opsm",
          "partial_rollout_max_aborted_count": "partial_rollout",
          "mask_offpolicy_in_partial_rollout": "partial_rollout"}

# episode sources whose unfinished episodes a checkpoint cannot hold (docs/configuration.md,
# "Off-policy"): an --env environment is rebuilt by replaying its recorded turns
# (relax/rollout/partial_episodes.py), an agent program's process is not
_NOT_CARRIED = {
    "use_agentic_rollout": "an agent run cut between steps lives on in its agent program's "
                           "process (its pending request and its own state), which a "
                           "checkpoint cannot hold",
}


def check_off_policy(cfg, explicit: set[str]) -> None:
    for dest, switch in _NEEDS.items():
        if dest in explicit and not value_of(cfg, switch):
            reject(cfg, dest, f"has no effect without --{switch.replace('_', '-')}; add it or "
                   "remove this flag")
    if cfg.rollout.off_policy.tis_clip <= 0:
        reject(cfg, "tis_clip", "must be > 0 (the largest importance weight a token gets), "
               "e.g. 2.0")
    if not 0 <= cfg.rollout.off_policy.tis_clip_low <= cfg.rollout.off_policy.tis_clip:
        reject(cfg, ("tis_clip_low", "tis_clip"), "the lower clip must lie in [0, --tis-clip]; "
               "use 0 for no lower clip")
    if cfg.rollout.off_policy.opsm_delta <= 0:
        reject(cfg, "opsm_delta", "must be > 0 (a mean log-ratio per token), e.g. 1e-4")
    if cfg.rollout.off_policy.use_tis and cfg.rollout.off_policy.use_rollout_logprobs:
        reject(cfg, ("use_tis", "use_rollout_logprobs"), "with the sampler's log-probs as pi_old "
               "every TIS weight is 1; keep one of them")
    if cfg.rollout.off_policy.custom_tis_path:
        check_custom_path(cfg, "custom_tis_function_path")
    if cfg.rollout.partial.enabled:
        _check_partial_rollout(cfg)


def _check_partial_rollout(cfg) -> None:
    over = cfg.batches.over_sampling_batch_size
    if over is None or over <= cfg.batches.rollout_batch_size:
        reject(cfg, ("partial_rollout", "over_sampling_batch_size"), "partial rollouts start "
               "more groups than a step trains on and carry the unfinished ones over; set "
               "--over-sampling-batch-size above --rollout-batch-size, e.g. twice it")
    for dest, why in _NOT_CARRIED.items():
        if value_of(cfg, dest):
            reject(cfg, ("partial_rollout", dest), f"partial rollouts carry unfinished samples "
                   f"into later steps and checkpoints, but {why}, so --load could not continue "
                   "it exactly; remove one of the two")
    if cfg.rollout.partial.max_aborted_count < 1:
        reject(cfg, "partial_rollout_max_aborted_count", "must be >= 1 (how many steps one "
               "response may be carried over before the step waits for it)")
    if not (cfg.rollout.partial.mask_off_policy or cfg.rollout.off_policy.use_tis or cfg.rollout.off_policy.use_rollout_logprobs):
        reject(cfg, "partial_rollout", "carried responses hold tokens an older policy sampled: "
               "add --mask-offpolicy-in-partial-rollout (leave them out of the loss) or correct "
               "for them with --use-tis or --use-rollout-logprobs")
