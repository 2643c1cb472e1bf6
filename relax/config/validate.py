"""Every configuration rule of ``relax train``, in one place (reinforce_plus_plus.md §8).

:func:`resolve_and_validate` checks a parsed :class:`~relax.config.schema.TrainConfig` and
returns the resolved one (derived batch sizes, output directory, ...), or raises
:class:`~relax.errors.ConfigError` for the first rule it breaks. It runs before torch,
transformers, a model or any data is loaded, and imports none of them: paths are checked with
``os.path`` and custom ``module:function`` paths on the file system, without executing user
code. Estimator rules ask the estimator's facts (:mod:`relax.estimators`), never its name.

The rules, in the order they are checked: first each section's own (:meth:`Section.check
<relax.config.section.Section.check>`: every field's bound, then rules among the section's
fields, e.g. ``RecomputeSection``'s), then the cross-section list :data:`RULES`:

1. value ranges of single flags, each its field's bound in its section (finite, positive, ...);
2. KL: ``--kl-coef`` and ``--kl-loss-coef`` never both nonzero, then the estimator's KL facts;
3. the reinforce_plus_plus.md §8 rows for both REINFORCE++ variants and the modes that no
   estimator implements (``--fully-async``, ``--context-parallel-size`` != 1),
   what ``--rollout-backend vllm`` does not serve (``rollout_backend.py``), then the rules
   of rloo and cispo (``estimator_rules.py``);
4. flags the chosen estimator would ignore (rejected rather than silently dropped);
5. environments (``--env``), data, reward, model paths, run directories, evaluation
   (``eval_flags.py``);
6. batch arithmetic against the data-parallel world size (``WORLD_SIZE``).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import time

from relax.config.async_rules import check_fully_async, training_world_size
from relax.config.bounds import check_bounds
from relax.config.checks import (
    check_custom_path,
    check_gym_answer,
    check_gym_spec,
    flag_of,
    reject,
)
from relax.config.constants import BUILTIN_FILTER_NAMES
from relax.config.critic_rules import check_critic
from relax.config.episode_rules import check_agents, check_env
from relax.config.estimator_rules import check_estimator_rules
from relax.config.eval_flags import check_train_eval, resolved_train_eval
from relax.config.gym_spec import is_reasoning_gym
from relax.config.off_policy_rules import check_off_policy
from relax.config.opd_rules import check_distillation
from relax.config.reward_services import check_reward_services
from relax.config.rollout_backend import check_rollout_backend
from relax.config.schema import TrainConfig
from relax.config.section import check_sections, flat_defaults, replace_flat, value_of
from relax.errors import ConfigError
from relax.estimators import LOSS_FLAGS, facts

_DEFAULTS = flat_defaults(TrainConfig)

# --------------------------------------------------------------------------- 1. ranges

# each field's own range is its ``bound`` (relax/config/section.py), checked first


# --------------------------------------------------------------------------- 2-4. algorithm

def _check_kl(cfg: TrainConfig) -> None:
    f = facts(cfg.algorithm.estimator)
    if cfg.algorithm.kl_coef != 0 and cfg.algorithm.kl_loss_coef != 0:
        reject(cfg, ("kl_coef", "kl_loss_coef"),
               "two reference-KL penalties at once; keep one (reward shaping --kl-coef for "
               "reinforce_plus_plus, the loss --use-kl-loss --kl-loss-coef otherwise) and set "
               "the other to 0")
    if f.kl_in_reward and not f.kl_loss_types:
        # the reward's KL is frozen to signed k1 and there is no second KL loss
        if cfg.algorithm.kl_loss_type != "k1":
            reject(cfg, "kl_loss_type", f"{f.name}: the reward KL estimator is frozen to signed "
                   f"k1 (reinforce_plus_plus.md {f.section}); set --kl-loss-type k1")
        for dest in ("use_kl_loss", "kl_loss_coef"):
            if value_of(cfg, dest):
                reject(cfg, dest, f"{f.name} has no second KL loss, KL enters only through the "
                       f"reward (reinforce_plus_plus.md {f.section}); remove {flag_of(dest)} "
                       "and use --kl-coef")
        return
    if cfg.algorithm.kl_coef != 0:
        if f.frozen:
            reject(cfg, "kl_coef", f"{f.name}: KL never enters the advantage "
                   f"(reinforce_plus_plus.md {f.section}); set --kl-coef 0 and use --use-kl-loss "
                   f"--kl-loss-type {f.kl_loss_types[0]} --kl-loss-coef 0.01")
        reject(cfg, "kl_coef", f"{f.name} has no reward KL shaping (only reinforce_plus_plus "
               "does); set --kl-coef 0 and use --use-kl-loss --kl-loss-coef instead")
    if cfg.algorithm.use_kl_loss and cfg.algorithm.kl_loss_type not in f.kl_loss_types:
        reject(cfg, ("use_kl_loss", "kl_loss_type"), f"{f.name}'s KL loss is the "
               f"{' / '.join(f.kl_loss_types)} penalty (reinforce_plus_plus.md {f.section}); "
               f"set --kl-loss-type {f.kl_loss_types[0]}")
    if not cfg.algorithm.use_kl_loss and cfg.algorithm.kl_loss_coef > 0:
        # --kl-loss-type alone is inert (valid upstream); a coefficient alone is a mistake
        reject(cfg, "kl_loss_coef", "has no effect without --use-kl-loss; add --use-kl-loss or "
               "set --kl-loss-coef 0")


def _check_modes(cfg: TrainConfig) -> None:
    f = facts(cfg.algorithm.estimator)
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


def _check_estimator_specific(cfg: TrainConfig) -> None:
    """Reject flags the estimator would ignore (its facts say what it reads)."""
    f = facts(cfg.algorithm.estimator)
    if cfg.algorithm.reward_post_process_path is not None and not f.custom_reward_post_process:
        reject(cfg, "custom_reward_post_process_path", f"{f.name}: it would bypass the frozen "
               f"group-mean baseline semantics (reinforce_plus_plus.md {f.section}, 8); remove "
               "--custom-reward-post-process-path")
    if cfg.algorithm.custom_advantage_path is not None and not f.custom_advantage:
        what = ("group-mean baseline semantics" if f.needs_group_index
                else "reward-to-go advantage")
        reject(cfg, "custom_advantage_function_path", f"{f.name}: it would replace the frozen "
               f"{what} (reinforce_plus_plus.md {f.section}); remove "
               "--custom-advantage-function-path")
    if cfg.algorithm.disable_std_normalization and not f.reads_std_normalization:
        reject(cfg, "disable_grpo_std_normalization", f"{f.name} never divides by a group "
               f"std (reinforce_plus_plus.md {f.section}); remove it")
    if not f.reads_gamma and cfg.algorithm.gamma != _DEFAULTS["gamma"]:
        reject(cfg, "gamma", f"{f.name} has no per-token discounted return, only "
               "reinforce_plus_plus and ppo read --gamma (reinforce_plus_plus.md §3, §5c); set "
               "--gamma 1.0")
    read = LOSS_FLAGS[f.policy_loss]
    for dest in sorted({d for flags in LOSS_FLAGS.values() for d in flags} - set(read)):
        if value_of(cfg, dest) != _DEFAULTS[dest]:
            reject(cfg, dest, f"{f.name}'s {f.policy_loss} loss does not read it "
                   f"(reinforce_plus_plus.md §7); remove it")
    if cfg.model.ref_load is not None and cfg.algorithm.kl_coef == 0 and not cfg.algorithm.use_kl_loss:
        reject(cfg, "ref_load", "no reference KL is on, so the reference model is never used; "
               "remove --ref-load or turn on a KL (--kl-coef or --use-kl-loss)")


# --------------------------------------------------------------------------- 5. paths, data

def _check_dir(cfg: TrainConfig, dest: str, what: str) -> None:
    value = value_of(cfg, dest)
    if value is not None and not os.path.isdir(value):
        reject(cfg, dest, f"no such directory; point it at {what}")


def _check_data_and_model(cfg: TrainConfig, explicit: set[str]) -> None:
    _check_dir(cfg, "hf_checkpoint", "a Hugging Face model directory")
    if cfg.model.hf_checkpoint is not None and not os.path.isfile(
            os.path.join(cfg.model.hf_checkpoint, "config.json")):
        reject(cfg, "hf_checkpoint", "no config.json in it; point it at a Hugging Face model "
               "directory")
    _check_dir(cfg, "ref_load", "a Hugging Face model directory with the reference weights")
    _check_dir(cfg, "load", "a checkpoint directory written by --save")
    for dest in ("custom_advantage_function_path", "custom_reward_post_process_path",
                 "custom_rm_path"):
        check_custom_path(cfg, dest)
    if cfg.rollout.data.prompt_data is not None:
        gym = is_reasoning_gym(cfg.rollout.data.prompt_data)
        if gym:
            check_gym_spec(cfg.rollout.data.prompt_data, "--prompt-data", role="train")
        elif not os.path.isfile(cfg.rollout.data.prompt_data):
            reject(cfg, "prompt_data", "no such file; give a .jsonl or .parquet prompt file, "
                   "or reasoning-gym:NAME")
        if "builtin_task" in explicit:
            reject(cfg, "builtin_task", "is only used without --prompt-data; remove one of them")
        if gym:
            for dest in ("input_key", "label_key"):
                if dest in explicit:
                    reject(cfg, dest, "a reasoning-gym source has no record keys; remove it")
        elif cfg.rollout.rewards.rm_type is None and cfg.rollout.rewards.custom_rm_path is None and not cfg.rollout.episodes.agentic:
            reject(cfg, "prompt_data", "needs a reward; add --rm-type math or --custom-rm-path "
                   "module:function")
    else:
        for dest in ("input_key", "label_key", "rollout_shuffle"):
            if value_of(cfg, dest) != _DEFAULTS[dest]:
                reject(cfg, dest, f"only applies to --prompt-data; the built-in task "
                       f"{cfg.rollout.data.builtin_task!r} is generated, remove {flag_of(dest)}")
        if cfg.rollout.rewards.rm_type is not None and cfg.rollout.rewards.rm_type != cfg.rollout.data.builtin_task:
            reject(cfg, "rm_type",
                   f"the built-in task {cfg.rollout.data.builtin_task!r} brings its own reward;"
                   f" remove --rm-type or give --prompt-data")
    if cfg.rollout.rewards.rm_type is not None and cfg.rollout.rewards.custom_rm_path is not None:
        reject(cfg, ("rm_type", "custom_rm_path"), "two reward functions; keep one")
    if cfg.rollout.data.apply_chat_template and cfg.model.hf_checkpoint is None:
        reject(cfg, "apply_chat_template", "the built-in tiny model has no chat template; "
               "add --hf-checkpoint or remove --apply-chat-template")
    if cfg.run.use_wandb and importlib.util.find_spec("wandb") is None:
        reject(cfg, "use_wandb", "wandb is not installed; pip install wandb (in a "
               "clone: pip install -e '.[wandb]') or remove --use-wandb")
    if cfg.run.use_tensorboard and importlib.util.find_spec("tensorboard") is None:
        reject(cfg, "use_tensorboard", "tensorboard is not installed; make install "
               "in a clone, or pip install tensorboard, or remove --use-tensorboard")


def _check_run(cfg: TrainConfig, explicit: set[str]) -> None:
    if cfg.batches.num_rollout is None and cfg.rollout.data.prompt_data is None:
        what = "--env episodes have" if cfg.rollout.episodes.env else "the built-in task has"
        reject(cfg, "num_rollout", f"{what} no end; set --num-rollout N")
    if cfg.batches.num_epoch is not None:
        if cfg.rollout.data.prompt_data is None:
            reject(cfg, "num_epoch", "only applies to --prompt-data; use --num-rollout")
        if "num_rollout" in explicit:
            reject(cfg, ("num_rollout", "num_epoch"), "give one length: rollout steps or "
                   "passes over --prompt-data")
    if cfg.run.exit_duration_in_mins is not None and not cfg.run.exit_duration_in_mins > 0:
        reject(cfg, "exit_duration_in_mins", "must be > 0 minutes")
    for dest in ("save_interval", "keep_last", "async_save"):
        if value_of(cfg, dest) not in (None, False) and cfg.checkpoint.save is None:
            reject(cfg, dest, "nothing is saved without --save DIR; add --save")
    interval, steps = cfg.checkpoint.save_interval, cfg.batches.num_rollout
    if interval is not None and steps is not None and interval > steps:
        reject(cfg, ("save_interval", "num_rollout"), "the interval is never reached, so no "
               "checkpoint but the last one (always written) would be saved; use a "
               "--save-interval of at most --num-rollout, or leave it out")
    for dest in ("save", "output_dir"):
        value = value_of(cfg, dest)
        if value is not None and os.path.exists(value) and not os.path.isdir(value):
            reject(cfg, dest, "exists and is not a directory; choose another path")
    if cfg.run.log_samples < 0:
        reject(cfg, "log_samples", "must be >= 0 samples per rollout step; 0 turns it off")


def _check_lora(cfg: TrainConfig) -> None:
    if cfg.lora.rank < 0:
        reject(cfg, "lora_rank", "must be >= 0; 0 turns LoRA off")
    if cfg.lora.rank == 0:
        for dest in ("lora_alpha", "lora_dropout", "lora_target_modules"):
            if value_of(cfg, dest) != _DEFAULTS[dest]:
                reject(cfg, dest, "has no effect without --lora-rank R; add it or remove this")
        return
    if importlib.util.find_spec("peft") is None:
        reject(cfg, "lora_rank", "needs the peft package; make install in a clone, or "
               "pip install peft")
    if cfg.lora.alpha <= 0:
        reject(cfg, "lora_alpha", "must be > 0, e.g. 16")
    if not 0.0 <= cfg.lora.dropout < 1.0:
        reject(cfg, "lora_dropout", "must lie in [0, 1); the default is 0")
    if cfg.system.fsdp:
        reject(cfg, ("lora_rank", "fsdp"), "LoRA trains with DDP replication (the adapters are "
               "small); remove --fsdp")


def _check_token_budget(cfg: TrainConfig) -> None:
    budgets = ("max_tokens_per_gpu", "log_probs_max_tokens_per_gpu")
    if not cfg.batches.token_budget:
        for dest in budgets:
            if value_of(cfg, dest) is not None:
                reject(cfg, dest, "has no effect without --use-dynamic-batch-size; add it or "
                       "remove the budget")
        return
    if cfg.batches.max_tokens_per_gpu is None:
        reject(cfg, "use_dynamic_batch_size", "needs --max-tokens-per-gpu N (padded tokens per "
               "micro-batch)")
    for dest in budgets:
        value = value_of(cfg, dest)
        if value is not None and value <= cfg.rollout.sampling.max_response_len:
            reject(cfg, (dest, "rollout_max_response_len"), "a budget must hold at least one "
                   "row: its prompt and a full response; use more than "
                   f"{cfg.rollout.sampling.max_response_len} tokens")


def _check_dynamic_sampling(cfg: TrainConfig) -> None:
    spec = cfg.batches.filter_path
    if spec is None:
        for dest in ("over_sampling_batch_size", "dynamic_sampling_max_rounds"):
            if dest == "over_sampling_batch_size" and cfg.rollout.partial.enabled:
                continue  # partial rollouts over-sample too (relax/config/off_policy_rules.py)
            if value_of(cfg, dest) != _DEFAULTS[dest]:
                reject(cfg, dest, "has no effect without --dynamic-sampling-filter-path; add "
                       "--dynamic-sampling-filter-path nonzero_std or remove it")
        return
    if spec in BUILTIN_FILTER_NAMES:
        if cfg.batches.samples_per_prompt < 2:
            reject(cfg, ("dynamic_sampling_filter_path", "n_samples_per_prompt"), "a group of "
                   "one sample never has two different rewards, so every group would be "
                   "filtered; set --n-samples-per-prompt 8")
    else:
        check_custom_path(cfg, "dynamic_sampling_filter_path")
    if cfg.rollout.episodes.env is not None or cfg.rollout.episodes.agentic:
        flag = "env" if cfg.rollout.episodes.env is not None else "use_agentic_rollout"
        reject(cfg, ("dynamic_sampling_filter_path", flag), "dynamic sampling filters the "
               "groups of single-turn rollouts; episodes are not filtered yet, remove one")
    over = cfg.batches.over_sampling_batch_size
    if over is not None and over < cfg.batches.rollout_batch_size:
        reject(cfg, ("over_sampling_batch_size", "rollout_batch_size"), "a round must offer at "
               "least the prompts a step trains on; use --over-sampling-batch-size >= "
               "--rollout-batch-size")
    if cfg.batches.max_rounds < 1:
        reject(cfg, "dynamic_sampling_max_rounds", "must be >= 1 rounds per rollout step")


# --------------------------------------------------------------------------- 6. batches

def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def _resolved_batches(cfg: TrainConfig, world_size: int) -> dict:
    """Global batch = samples per optimizer step; micro batch = samples per rank per pass."""
    samples = cfg.batches.rollout_batch_size * cfg.batches.samples_per_prompt
    what = (f"a rollout step makes --rollout-batch-size {cfg.batches.rollout_batch_size} x "
            f"--n-samples-per-prompt {cfg.batches.samples_per_prompt} = {samples} samples")
    steps, global_batch = cfg.batches.steps_per_rollout, cfg.batches.global_batch_size
    if global_batch is None:
        if steps is not None and samples % steps:
            reject(cfg, "num_steps_per_rollout", f"{what}, not divisible into {steps} "
                   f"optimizer steps; use one of {_divisors(samples)}")
        global_batch = samples // steps if steps is not None else samples
    elif samples % global_batch:
        reject(cfg, "global_batch_size", f"{what}, not a multiple of the global batch; use one "
               f"of {_divisors(samples)}")
    elif steps is not None and steps * global_batch != samples:
        reject(cfg, ("global_batch_size", "num_steps_per_rollout"), f"{what}, not "
               f"{steps} x {global_batch}; give only one of the two")
    if cfg.batches.rollout_batch_size % world_size:
        reject(cfg, "rollout_batch_size", f"WORLD_SIZE={world_size} ranks need whole prompt "
               f"groups each; use a multiple of {world_size}")
    if cfg.batches.over_sampling_batch_size is not None and cfg.batches.over_sampling_batch_size % world_size:
        reject(cfg, "over_sampling_batch_size", f"WORLD_SIZE={world_size} ranks need whole "
               f"prompt groups each; use a multiple of {world_size}")
    if global_batch % world_size:
        resolved = replace_flat(cfg, global_batch_size=global_batch)
        reject(resolved, "global_batch_size", f"not divisible by WORLD_SIZE={world_size} ranks; "
               f"use a multiple of {world_size}")
    micro = cfg.batches.micro_batch_size or global_batch // world_size
    if global_batch % (world_size * micro):
        resolved = replace_flat(cfg, global_batch_size=global_batch, micro_batch_size=micro)
        reject(resolved, ("global_batch_size", "micro_batch_size"), f"the global batch must be "
               f"a multiple of WORLD_SIZE={world_size} x --micro-batch-size; use a micro batch "
               f"among {_divisors(global_batch // world_size)}")
    return {"global_batch_size": global_batch, "micro_batch_size": micro,
            "num_steps_per_rollout": samples // global_batch}


# --------------------------------------------------------------------------- entry

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


def _check_gym_answers(cfg: TrainConfig, explicit: set[str]) -> None:
    check_gym_answer(cfg, explicit, [cfg.rollout.data.prompt_data, *(
        p for _, p in resolved_train_eval(cfg)["eval_prompt_data"] or ())])


# The rules across sections, in the order they are checked (the first broken one is reported);
# each takes the config (and the set of flags given, when it has an ``explicit`` parameter).
RULES = (
    check_bounds, _check_kl, _check_modes,
    check_rollout_backend,  # before the rules of the modes it refuses
    check_estimator_rules, _check_estimator_specific, check_env, check_agents,
    _check_data_and_model, check_train_eval, _check_gym_answers, _check_run,
    _check_dynamic_sampling, _check_token_budget, _check_lora, check_off_policy,
    check_reward_services, check_distillation, check_critic, check_fully_async,
)


def resolve_and_validate(cfg: TrainConfig, explicit: set[str], world_size: int) -> TrainConfig:
    """Check every rule and return the resolved config (``cfg`` itself is left as it is).

    Raises :class:`ConfigError` on the first broken rule.
    """
    check_sections(cfg)  # each section's own rules, its fields' bounds first
    for rule in RULES:
        if "explicit" in inspect.signature(rule).parameters:
            rule(cfg, explicit)
        else:
            rule(cfg)
    world_size = training_world_size(cfg, world_size)  # --fully-async: the training ranks
    output_dir = cfg.run.output_dir or os.path.join(
        "runs", f"{cfg.algorithm.estimator}-{time.strftime('%Y%m%d-%H%M%S')}")
    return replace_flat(
        cfg,
        **_resolved_batches(cfg, world_size),
        **resolved_train_eval(cfg),
        eps_clip_high=cfg.algorithm.eps_clip if cfg.algorithm.eps_clip_high is None else cfg.algorithm.eps_clip_high,
        num_epoch=1 if cfg.batches.num_epoch is None else cfg.batches.num_epoch,
        # the built-in task is not used with --prompt-data; keep the JSON honest
        builtin_task=(None if cfg.rollout.data.prompt_data is not None or cfg.rollout.episodes.env is not None
                      else cfg.rollout.data.builtin_task),
        output_dir=output_dir,
        world_size=world_size,
        **_resolved_dynamic_sampling(cfg),
        get_mismatch_metrics=cfg.rollout.off_policy.mismatch_metrics is not False,
    )


def _resolved_dynamic_sampling(cfg: TrainConfig) -> dict:
    if cfg.batches.filter_path is None:
        return {}
    return {"over_sampling_batch_size": cfg.batches.over_sampling_batch_size or cfg.batches.rollout_batch_size}
