"""Upper bounds on the work a setting asks of one rollout step, checked at validation, before
anything is built: a typo such as ``--rollout-batch-size 10000000`` would otherwise build ten
million environments or prompts and end in the kernel's OOM killer, without a word.

The bounds are far above published setups (DAPO: 512 prompts x 16 samples = 8192 samples a
step) and low enough that exceeding them is a mistake; each message gives the bound. The
reasoning-gym ``size`` bound lives with the spec parser (relax/config/gym_spec.py).
"""

from __future__ import annotations

from relax.config.checks import reject

MAX_SAMPLES_PER_STEP = 1 << 20  # samples (or episodes) one rollout step or round generates
MAX_ROUNDS = 1000  # --dynamic-sampling-max-rounds
MAX_TURNS = 10_000  # --max-turns
MAX_TOKENS = 1 << 20  # --rollout-max-response-len / --eval-max-response-len, per turn
MAX_MMAP_THRESHOLD_KB = 32 << 10  # glibc refuses an M_MMAP_THRESHOLD above 32 MiB (64-bit)


def check_bounds(cfg) -> None:
    """Raise ConfigError for the first count of ``cfg`` (a TrainConfig) past its bound."""
    n = cfg.n_samples_per_prompt
    for dest in ("rollout_batch_size", "over_sampling_batch_size"):
        prompts = getattr(cfg, dest)
        if prompts is not None and prompts * n > MAX_SAMPLES_PER_STEP:
            reject(cfg, (dest, "n_samples_per_prompt"), f"{prompts} x {n} = {prompts * n} "
                   f"samples per rollout step, more than the bound of {MAX_SAMPLES_PER_STEP}; "
                   "use fewer prompts or samples per step")
    if cfg.dynamic_sampling_max_rounds > MAX_ROUNDS:
        reject(cfg, "dynamic_sampling_max_rounds", f"must be <= {MAX_ROUNDS} rounds per "
               "rollout step")
    check_shared_bounds(cfg)
    for dest in ("rollout_max_response_len", "eval_max_response_len"):
        value = getattr(cfg, dest)
        if value is not None and value > MAX_TOKENS:
            reject(cfg, dest, f"must be <= {MAX_TOKENS} tokens")


def check_shared_bounds(cfg) -> None:
    """The bounds ``relax train`` and ``relax eval`` share: turns, evaluation episodes and
    the host memory-map threshold."""
    if not 0 <= cfg.host_mmap_threshold_kb <= MAX_MMAP_THRESHOLD_KB:
        reject(cfg, "host_mmap_threshold_kb", f"must be between 0 (glibc's dynamic threshold) "
               f"and {MAX_MMAP_THRESHOLD_KB} KiB, glibc's largest")
    if cfg.max_turns > MAX_TURNS:
        reject(cfg, "max_turns", f"must be <= {MAX_TURNS} model turns per episode")
    plays = cfg.eval_episodes * cfg.n_samples_per_eval_prompt
    if plays > MAX_SAMPLES_PER_STEP:
        reject(cfg, ("eval_episodes", "n_samples_per_eval_prompt"), f"{cfg.eval_episodes} x "
               f"{cfg.n_samples_per_eval_prompt} = {plays} episodes per evaluation, more than "
               f"the bound of {MAX_SAMPLES_PER_STEP}")
