"""Upper bounds on the work a setting asks of one rollout step, checked at validation, before
anything is built: a typo such as ``--rollout-batch-size 10000000`` would otherwise build ten
million environments or prompts and end in the kernel's OOM killer, without a word.

The bounds are far above published setups (DAPO: 512 prompts x 16 samples = 8192 samples a
step) and low enough that exceeding them is a mistake; each message gives the bound. The
reasoning-gym ``size`` bound lives with the spec parser (relax/config/gym_spec.py).
"""

from __future__ import annotations

from relax.config.checks import reject
from relax.config.section import value_of

MAX_SAMPLES_PER_STEP = 1 << 20  # samples (or episodes) one rollout step or round generates
MAX_ROUNDS = 1000  # --dynamic-sampling-max-rounds
MAX_TURNS = 10_000  # --max-turns
MAX_TOKENS = 1 << 20  # --rollout-max-response-len / --eval-max-response-len, per turn
MAX_MMAP_THRESHOLD_KB = 32 << 10  # glibc refuses an M_MMAP_THRESHOLD above 32 MiB (64-bit)

# Float flags that scale, clip or divide float32 (or bf16, the same exponent range) tensors:
# beyond float32's range a clamp bound is a RuntimeError ("cannot be converted to type float
# without overflow") and a coefficient an infinity; below its smallest normal number a
# temperature or coefficient is flushed towards 0. Torch-free, so the limits are written out.
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32
FLOAT32_FLAGS = ("tis_clip", "tis_clip_low", "eps_clip", "eps_clip_high", "eps_clip_c",
                 "sapo_tau_pos", "sapo_tau_neg", "entropy_coef", "kl_coef", "kl_loss_coef",
                 "opd_kl_coef", "opsd_jsd_clip", "value_clip", "critic_lr", "opsm_delta", "gamma", "lora_alpha", "rollout_temperature",
                 "eval_temperature", "lr", "weight_decay")


def check_bounds(cfg) -> None:
    """Raise ConfigError for the first count of ``cfg`` (a TrainConfig) past its bound."""
    n = cfg.batches.samples_per_prompt
    for dest in ("rollout_batch_size", "over_sampling_batch_size"):
        prompts = value_of(cfg, dest)
        if prompts is not None and prompts * n > MAX_SAMPLES_PER_STEP:
            reject(cfg, (dest, "n_samples_per_prompt"), f"{prompts} x {n} = {prompts * n} "
                   f"samples per rollout step, more than the bound of {MAX_SAMPLES_PER_STEP}; "
                   "use fewer prompts or samples per step")
    if cfg.batches.max_rounds > MAX_ROUNDS:
        reject(cfg, "dynamic_sampling_max_rounds", f"must be <= {MAX_ROUNDS} rounds per "
               "rollout step")
    check_shared_bounds(cfg)
    check_float32(cfg, FLOAT32_FLAGS)
    for dest in ("rollout_max_response_len", "eval_max_response_len"):
        value = value_of(cfg, dest)
        if value is not None and value > MAX_TOKENS:
            reject(cfg, dest, f"must be <= {MAX_TOKENS} tokens")


def check_shared_bounds(cfg) -> None:
    """The bounds ``relax train`` and ``relax eval`` share: turns, evaluation episodes, the
    host memory-map threshold and the evaluation temperature's float32 range."""
    check_float32(cfg, ("eval_temperature",))
    if not 0 <= cfg.system.host_mmap_threshold_kb <= MAX_MMAP_THRESHOLD_KB:
        reject(cfg, "host_mmap_threshold_kb", f"must be between 0 (glibc's dynamic threshold) "
               f"and {MAX_MMAP_THRESHOLD_KB} KiB, glibc's largest")
    if cfg.rollout.episodes.max_turns > MAX_TURNS:
        reject(cfg, "max_turns", f"must be <= {MAX_TURNS} model turns per episode")
    plays = cfg.evaluation.episodes * cfg.evaluation.n_samples
    if plays > MAX_SAMPLES_PER_STEP:
        reject(cfg, ("eval_episodes", "n_samples_per_eval_prompt"), f"{cfg.evaluation.episodes} x "
               f"{cfg.evaluation.n_samples} = {plays} episodes per evaluation, more than "
               f"the bound of {MAX_SAMPLES_PER_STEP}")


def check_float32(cfg, dests) -> None:
    """Each of ``dests`` that ``cfg`` holds (None: unset) is 0 or a normal float32 in
    magnitude, [1.2e-38, 3.4e38]; the message names the flag and the range."""
    for dest in dests:
        value = value_of(cfg, dest, None)
        if value is None or value == 0 or FLOAT32_TINY <= abs(value) <= FLOAT32_MAX:
            continue
        side = "beyond" if abs(value) > FLOAT32_MAX else "below"
        reject(cfg, dest, f"{side} the range of float32, the dtype of the tensors it is used "
               f"with (0 or a magnitude in [{FLOAT32_TINY:.2g}, {FLOAT32_MAX:.3g}])")
