"""Every configuration rule of ``relax train``, in the order they are checked
(reinforce_plus_plus.md §8).

:func:`resolve_and_validate` checks a parsed :class:`~relax.config.schema.TrainConfig` and
returns the resolved one (derived batch sizes, output directory, ...), or raises
:class:`~relax.errors.ConfigError` for the first rule it breaks. It runs before torch,
transformers, a model or any data is loaded, and imports none of them: paths are checked with
``os.path`` and custom ``module:function`` paths on the file system, without executing user
code. Estimator rules ask the estimator's facts (:mod:`relax.estimators`), never its name.

A field's rules are found in its section's module (relax/config/sections/): its bound and
what it needs (``option(bound=..., requires=...)``) and the rules among the section's fields
(``Section.check``). The order:

1. the tree, section by section in declaration order: each field's bounds, then the
   section's own rules (:func:`~relax.config.section.check_tree`);
2. every field set without what it needs, "has no effect without X"
   (:func:`~relax.config.section.check_requirements`);
3. :data:`CROSS_RULES`, the rules that span sections, each naming its sections;
4. batch arithmetic against the data-parallel world size (``WORLD_SIZE``) while resolving.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import NamedTuple

from relax.config.schema import TrainConfig
from relax.config.section import check_requirements, check_tree, replace_flat
from relax.config.sections import (
    algorithm,
    backend,
    batches,
    checkpoint,
    critic,
    data,
    distillation,
    episodes,
    evaluation,
    length,
    lora,
    partial,
    placement,
    rewards,
)
from relax.errors import ConfigError


class Rule(NamedTuple):
    """A rule across sections: the sections it reads (for the reader and the docs) and its
    check, ``check(cfg, explicit)`` with ``explicit`` the flags the user gave."""

    sections: tuple[str, ...]
    check: Callable[[TrainConfig, set[str]], None]


# The rules across sections, in the order they are checked (the first broken one is reported).
CROSS_RULES: tuple[Rule, ...] = (
    Rule(("algorithm", "placement", "system"), algorithm.check_modes),
    Rule(("rollout.backend", "model", "rollout.sampling", "placement", "lora",
          "rollout.off_policy"), backend.check_vllm_backend),  # before the modes it refuses
    Rule(("algorithm", "batches", "rollout.partial", "rollout.off_policy"),
         algorithm.check_estimator_facts),
    Rule(("rollout.episodes", "system", "rollout.data", "rollout.rewards", "evaluation"),
         episodes.check_env_scope),
    Rule(("rollout.episodes", "rollout.rewards", "rollout.data", "evaluation", "system"),
         episodes.check_agent_scope),
    Rule(("rollout.data", "rollout.rewards", "rollout.episodes"), data.check_prompt_reward),
    Rule(("evaluation", "rollout.data", "rollout.rewards"), evaluation.check_train_eval),
    Rule(("rollout.data", "rollout.rewards", "evaluation"), data.check_gym_answers),
    Rule(("batches", "rollout.data", "rollout.episodes"), batches.check_run_length),
    Rule(("checkpoint", "batches"), checkpoint.check_save_interval),
    Rule(("batches", "rollout.episodes"), batches.check_dynamic_sampling_episodes),
    Rule(("batches", "rollout.sampling"), batches.check_token_budget_fits),
    Rule(("lora", "system"), lora.check_lora_replication),
    Rule(("rollout.partial", "batches", "rollout.episodes", "rollout.off_policy"),
         partial.check_partial_rollout),
    Rule(("rollout.rewards", "rollout.episodes", "evaluation"), rewards.check_reward_scope),
    Rule(("distillation", "rollout.data", "rollout.episodes", "rollout.partial"),
         distillation.check_self_distillation),
    Rule(("distillation", "rollout.sampling"), distillation.check_teacher_server),
    Rule(("critic", "batches"), critic.check_critic_steps),
    Rule(("placement", "rollout.off_policy"), placement.check_staleness),
    Rule(("rollout.length", "rollout.sampling", "rollout.episodes", "algorithm"),
         length.check_length),
)


def world_size_from_env(environ=None) -> int:
    """Data-parallel world size: ``WORLD_SIZE`` as torchrun sets it, else 1."""
    environ = os.environ if environ is None else environ
    raw = environ.get("WORLD_SIZE", "1")
    try:
        world_size = int(raw)
    except ValueError:
        world_size = 0
    if world_size < 1:
        raise ConfigError(f"WORLD_SIZE={raw}", "must be a positive integer (torchrun sets it); "
                          "unset it for a single process")
    return world_size


def validate(cfg: TrainConfig, explicit: set[str]) -> None:
    """Raise :class:`ConfigError` for the first rule of ``cfg`` broken, in the order of the
    module docstring."""
    check_tree(cfg)
    check_requirements(cfg, explicit)
    for rule in CROSS_RULES:
        rule.check(cfg, explicit)


def resolve_and_validate(cfg: TrainConfig, explicit: set[str], world_size: int) -> TrainConfig:
    """Check every rule and return the resolved config (``cfg`` itself is left as it is).

    Raises :class:`ConfigError` on the first broken rule.
    """
    validate(cfg, explicit)
    world_size = placement.training_world_size(cfg, world_size)  # --fully-async: trainers
    output_dir = cfg.run.output_dir or os.path.join(
        "runs", f"{cfg.algorithm.advantage_estimator}-{time.strftime('%Y%m%d-%H%M%S')}")
    return replace_flat(
        cfg,
        **batches.resolved_batches(cfg, world_size),
        **evaluation.resolved_train_eval(cfg),
        eps_clip_high=cfg.algorithm.eps_clip if cfg.algorithm.eps_clip_high is None else cfg.algorithm.eps_clip_high,
        num_epoch=(batches.EPOCHS_WHEN_UNSET if cfg.batches.num_epoch is None
                   else cfg.batches.num_epoch),
        # the built-in task is not used with --prompt-data; keep the JSON honest
        builtin_task=(None if cfg.rollout.data.prompt_data is not None or cfg.rollout.episodes.env is not None
                      else cfg.rollout.data.builtin_task),
        output_dir=output_dir,
        world_size=world_size,
        **batches.resolved_dynamic_sampling(cfg),
        get_mismatch_metrics=cfg.rollout.off_policy.get_mismatch_metrics is not False,
    )
