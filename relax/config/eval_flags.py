"""Evaluation rules: the evaluation flags of ``relax train`` (periodic evaluation) and the
``relax eval`` command.

    relax train ... --eval-interval 10 --eval-prompt-data gsm8k data/gsm8k/test.jsonl
    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math

``--eval-prompt-data`` takes ``PATH`` (the set is named after the file stem) or
``NAME PATH [NAME PATH ...]`` (Relax/slime convention); the resolved value is a list of
``[name, path]`` pairs, and every metric is ``eval/<name>/...``. Without it, a run on the
built-in task evaluates on :data:`BUILTIN_EVAL_PROMPTS` fixed prompts of that task.

The sampling flags default to the rollout's (``--eval-temperature`` unset -> resolved to
``--rollout-temperature`` and so on); ``--eval-temperature 0`` is greedy decoding. A sample
passes when its reward is >= ``--eval-pass-threshold`` (1.0: an exact answer for the math
reward and the built-in tasks). Like every flag, an evaluation flag that would have no effect
is rejected rather than ignored. Nothing here imports torch.
"""

from __future__ import annotations

import os

from relax.config.bounds import check_shared_bounds
from relax.config.checks import (
    check_custom_path,
    check_env_name,
    check_gym_answer,
    eval_pairs,
    flag_of,
    head,
    reject,
)
from relax.config.gym_spec import is_reasoning_gym
from relax.config.presets import BUILTIN_PRESET
from relax.config.rollout_backend import check_eval_backend
from relax.config.schema import EvalConfig, TrainConfig
from relax.config.section import check_sections, flat_defaults, replace_flat, value_of
from relax.errors import ConfigError

# Fixed held-out prompts drawn per built-in task when no --eval-prompt-data is given.
BUILTIN_EVAL_PROMPTS = 64

# eval sampling field -> the rollout field it follows in ``relax train``
FOLLOWS = {
    "eval_temperature": "rollout_temperature",
    "eval_top_p": "rollout_top_p",
    "eval_top_k": "rollout_top_k",
    "eval_max_response_len": "rollout_max_response_len",
}
_DEFAULTS = flat_defaults(EvalConfig)
# the fields that only matter when an evaluation runs (train: --eval-interval)
EVAL_FIELDS = ("eval_prompt_data", "n_samples_per_eval_prompt", "eval_temperature", "eval_top_p",
               "eval_top_k", "eval_max_response_len", "eval_batch_size", "eval_episodes",
               "eval_pass_threshold")


def check_train_eval(cfg: TrainConfig, explicit: set[str]) -> None:
    """Evaluation rules of ``relax train``."""
    if cfg.evaluation.interval is not None and cfg.evaluation.interval < 1:
        reject(cfg, "eval_interval", "must be >= 1 rollout steps")
    if "eval_episodes" in explicit and cfg.rollout.episodes.env is None:
        reject(cfg, "eval_episodes", "only applies to --env (evaluation of prompts runs on "
               "--eval-prompt-data); remove it")
    if cfg.evaluation.interval is None:
        for dest in EVAL_FIELDS:
            if dest in explicit:
                reject(cfg, dest, "has no effect without --eval-interval N (evaluation only "
                       "runs every N rollout steps); add --eval-interval or remove it")
    pairs = eval_pairs(cfg)
    if cfg.evaluation.interval is not None and pairs is None and cfg.rollout.data.prompt_data:
        raise ConfigError(head(cfg, "eval_interval"), "with --prompt-data the evaluation set "
                          "must be given; add --eval-prompt-data NAME PATH")
    if (pairs and is_reasoning_gym(cfg.rollout.data.prompt_data) and cfg.rollout.rewards.rm_type is None
            and cfg.rollout.rewards.custom_rm_path is None):
        files = [p for _, p in pairs if not is_reasoning_gym(p)]
        if files:
            raise ConfigError(f"--eval-prompt-data {files[0]}", "a data file needs a reward, "
                              "and the reasoning-gym verifier only scores reasoning-gym sets; "
                              "evaluate on reasoning-gym:NAME or add --custom-rm-path")


def resolved_train_eval(cfg: TrainConfig) -> dict:
    """The evaluation fields ``relax train`` resolves: the named sets and the sampling
    settings that follow the rollout's."""
    values = {dest: value_of(cfg, rollout) for dest, rollout in FOLLOWS.items()
              if value_of(cfg, dest) is None}
    return {"eval_prompt_data": eval_pairs(cfg), **values}


def _check_checkpoint_dir(ckpt: str) -> None:
    """CHECKPOINT is a model directory relax eval can load (not a sharded training state)."""
    if not os.path.isdir(ckpt):
        raise ConfigError(ckpt, "no such directory; give a checkpoint written by relax train "
                          "--save (or any Hugging Face model directory)")
    if os.path.isfile(os.path.join(ckpt, ".metadata")):
        raise ConfigError(ckpt, "a sharded training checkpoint (model and optimizer state); "
                          "write its model with: relax export CHECKPOINT OUTPUT_DIR, then "
                          "evaluate OUTPUT_DIR (or give the --save directory: its final model)")
    if not any(os.path.isfile(os.path.join(ckpt, name))
               for name in ("config.json", "adapter_config.json")):
        raise ConfigError(ckpt, "no config.json in it; give the --save directory of a run, a "
                          "directory written by relax export, a PEFT adapter directory, or "
                          "any Hugging Face model")


def _check_eval_command(cfg: EvalConfig, explicit: set[str]) -> list | None:
    check_sections(cfg)
    check_shared_bounds(cfg)
    _check_checkpoint_dir(cfg.checkpoint)
    out = cfg.run.output_dir
    if out is not None and os.path.exists(out) and not os.path.isdir(out):
        reject(cfg, "output_dir", "exists and is not a directory; choose another path")
    check_eval_backend(cfg, explicit)
    if cfg.rollout.episodes.env is not None:
        _check_eval_env(cfg, explicit)
        return None
    for dest in ("max_turns", "eval_episodes", "env_step_timeout"):
        if dest in explicit:
            reject(cfg, dest, "only applies to --env episodes; add --env or remove it")
    pairs, rewards = eval_pairs(cfg), cfg.rollout.rewards
    check_custom_path(cfg, "custom_rm_path")
    if rewards.rm_type is not None and rewards.custom_rm_path is not None:
        reject(cfg, ("rm_type", "custom_rm_path"), "two reward functions; keep one")
    if rewards.rm_type in ("remote_rm", "genrm"):
        reject(cfg, "rm_type", "relax eval scores with a local reward (--rm-type math, a "
               "built-in task's, --custom-rm-path); remote_rm and genrm are relax train's")
    if pairs is None:
        task = cfg.rollout.data.builtin_task
        if rewards.rm_type is not None and rewards.rm_type != task:
            reject(cfg, "rm_type", f"the built-in task {task!r} brings its own reward; remove "
                   "--rm-type or give --eval-prompt-data")
        for dest in ("input_key", "label_key"):
            if value_of(cfg, dest) != _DEFAULTS[dest]:
                reject(cfg, dest, "only applies to --eval-prompt-data; remove it")
    else:
        if "builtin_task" in explicit:
            reject(cfg, "builtin_task", "is only used without --eval-prompt-data; remove one "
                   "of them")
        files = [p for _, p in pairs if not is_reasoning_gym(p)]
        if files and rewards.rm_type is None and rewards.custom_rm_path is None:
            raise ConfigError(f"--eval-prompt-data {files[0]}", "needs a reward; add --rm-type "
                              "math or --custom-rm-path module:function")
    check_gym_answer(cfg, explicit, [p for _, p in pairs or ()])
    return pairs


def _check_eval_env(cfg: EvalConfig, explicit: set[str]) -> None:
    """``relax eval --env``: the environment makes the prompts and scores the episodes."""
    check_env_name(cfg)
    for dest in ("eval_prompt_data", "rm_type", "custom_rm_path", "builtin_task", "input_key",
                 "label_key", "reasoning_gym_answer"):
        if dest in explicit:
            reject(cfg, ("env", dest), "the environment makes the prompts and scores the "
                   f"episodes; remove {flag_of(dest)}")


def resolve_eval_command(cfg: EvalConfig, explicit: set[str]) -> EvalConfig:
    """Check ``relax eval CHECKPOINT`` (no training flags, nothing heavy imported) and return
    the resolved config: named sets, and the sampling settings the training run used by
    default (the built-in preset's for the built-in model)."""
    pairs = _check_eval_command(cfg, explicit)
    builtin_task = cfg.rollout.data.builtin_task if pairs is None and cfg.rollout.episodes.env is None else None
    train_defaults = flat_defaults(TrainConfig)
    if builtin_task is not None:
        train_defaults.update(BUILTIN_PRESET)
    follow = {dest: train_defaults[rollout] for dest, rollout in FOLLOWS.items()
              if value_of(cfg, dest) is None}
    return replace_flat(cfg, eval_prompt_data=pairs, builtin_task=builtin_task, **follow)
