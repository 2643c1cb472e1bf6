"""Rules of the off-policy flags (reinforce_plus_plus.md §7a): the clips of ``--use-tis``, the
threshold of ``--use-opsm``, and the flags that need one of them. Torch-free, like the rest of
validation."""

from __future__ import annotations

from relax.config.checks import check_custom_path, reject

# flag -> the switch it needs
_NEEDS = {"tis_clip": "use_tis", "tis_clip_low": "use_tis",
          "custom_tis_function_path": "use_tis", "opsm_delta": "use_opsm"}


def check_off_policy(cfg, explicit: set[str]) -> None:
    for dest, switch in _NEEDS.items():
        if dest in explicit and not getattr(cfg, switch):
            reject(cfg, dest, f"has no effect without --{switch.replace('_', '-')}; add it or "
                   "remove this flag")
    if cfg.tis_clip <= 0:
        reject(cfg, "tis_clip", "must be > 0 (the largest importance weight a token gets), "
               "e.g. 2.0")
    if not 0 <= cfg.tis_clip_low <= cfg.tis_clip:
        reject(cfg, ("tis_clip_low", "tis_clip"), "the lower clip must lie in [0, --tis-clip]; "
               "use 0 for no lower clip")
    if cfg.opsm_delta <= 0:
        reject(cfg, "opsm_delta", "must be > 0 (a mean log-ratio per token), e.g. 1e-4")
    if cfg.use_tis and cfg.use_rollout_logprobs:
        reject(cfg, ("use_tis", "use_rollout_logprobs"), "with the sampler's log-probs as pi_old "
               "every TIS weight is 1; keep one of them")
    if cfg.custom_tis_function_path:
        check_custom_path(cfg, "custom_tis_function_path")
