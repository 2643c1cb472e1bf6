"""The ``relax eval`` command's rules and resolution.

    relax eval CHECKPOINT_DIR --eval-prompt-data gsm8k data/gsm8k/test.jsonl --rm-type math

``relax eval`` has the flags of :data:`~relax.config.schema.EVAL_FLAGS`, fields of the sections
``relax train`` has (relax/config/sections/): their bounds and own rules are checked as there
(the tree walk), and the needs marked for it; the rules below are the command's own. The
sampling settings it does not get follow what the training run used by default
(``option(follows=...)``). Like every flag, a flag that would have no effect is rejected
rather than ignored. Nothing here imports torch.
"""

from __future__ import annotations

import os

from relax.config.checks import check_gym_answer, eval_pairs
from relax.config.gym_spec import is_reasoning_gym
from relax.config.presets import BUILTIN_PRESET
from relax.config.schema import EvalConfig, TrainConfig
from relax.config.section import (
    check_requirements,
    check_tree,
    flag_of,
    flat_defaults,
    followers,
    reject,
    replace_flat,
    value_of,
)
from relax.config.sections.evaluation import EvaluationSection
from relax.errors import ConfigError

_DEFAULTS = flat_defaults(EvalConfig)


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
    rewards = cfg.rollout.rewards
    if rewards.rm_type in ("remote_rm", "genrm"):
        reject(cfg, "rm_type", "relax eval scores with a local reward (--rm-type math, a "
               "built-in task's, --custom-rm-path); remote_rm and genrm are relax train's")
    check_tree(cfg)
    _check_checkpoint_dir(cfg.checkpoint)
    check_requirements(cfg, explicit, "eval")
    if cfg.rollout.episodes.env is not None:
        _check_eval_env(cfg, explicit)
        return None
    for dest in ("max_turns", "eval_episodes", "env_step_timeout"):
        if dest in explicit:
            reject(cfg, dest, "only applies to --env episodes; add --env or remove it")
    pairs = eval_pairs(cfg)
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
    follow = {dest: train_defaults[rollout]
              for dest, rollout in followers(EvaluationSection).items()
              if value_of(cfg, dest) is None}
    return replace_flat(cfg, eval_prompt_data=pairs, builtin_task=builtin_task, **follow)
