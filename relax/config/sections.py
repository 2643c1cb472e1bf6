"""The configuration in sections: what each component reads, typed, with short names.

The flags stay flat (``relax train --rollout-temperature 0.7``) and so does
:class:`~relax.config.schema.TrainConfig`; each section is a frozen view of the fields one
component needs, built from a resolved config::

    cfg.algorithm.estimator           # --advantage-estimator
    cfg.batches.samples_per_prompt    # --n-samples-per-prompt
    cfg.rollout.temperature           # --rollout-temperature
    cfg.lora.rank                     # --lora-rank
    cfg.evaluation.n_samples          # --n-samples-per-eval-prompt (relax train and relax eval)
    cfg.checkpoint.save_interval      # --save-interval

A section field is the flag of the same name unless its metadata names another
(``flag("advantage_estimator")``); list values become tuples, so a section is immutable all
the way down. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


def flag(name: str, *, train_only: bool = False):
    """A section field read from the config field ``name``; ``train_only``: None on a config
    without it (``relax eval`` has no ``--eval-interval``)."""
    return field(metadata={"flag": name, "train_only": train_only})


def _frozen(value):
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


class Section:
    """Built from a config by :meth:`of`; every field is a flag's value."""

    @classmethod
    def of(cls, cfg):
        values = {}
        for f in dataclasses.fields(cls):
            name = f.metadata.get("flag", f.name)
            if f.metadata.get("train_only") and not hasattr(cfg, name):
                values[f.name] = None
            else:
                values[f.name] = _frozen(getattr(cfg, name))
        return cls(**values)

    @classmethod
    def flags(cls) -> dict[str, str]:
        """Section field -> the config field (flag) it reads."""
        return {f.name: f.metadata.get("flag", f.name) for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class AlgorithmSection(Section):
    """Advantage estimator, losses and KL (reinforce_plus_plus.md §2-§7)."""

    estimator: str = flag("advantage_estimator")
    normalize_advantages: bool = flag("normalize_advantages")
    gamma: float = flag("gamma")
    kl_coef: float = flag("kl_coef")
    kl_loss_type: str = flag("kl_loss_type")
    use_kl_loss: bool = flag("use_kl_loss")
    kl_loss_coef: float = flag("kl_loss_coef")
    entropy_coef: float = flag("entropy_coef")
    eps_clip: float = flag("eps_clip")
    eps_clip_high: float | None = flag("eps_clip_high")
    eps_clip_c: float | None = flag("eps_clip_c")
    sapo_tau_pos: float = flag("sapo_tau_pos")
    sapo_tau_neg: float = flag("sapo_tau_neg")
    disable_std_normalization: bool = flag("disable_grpo_std_normalization")
    per_token_loss: bool = flag("calculate_per_token_loss")
    custom_advantage_path: str | None = flag("custom_advantage_function_path")
    reward_post_process_path: str | None = flag("custom_reward_post_process_path")


@dataclass(frozen=True)
class BatchSection(Section):
    """Sizes in prompts and samples, micro-batching and dynamic sampling."""

    rollout_batch_size: int = flag("rollout_batch_size")
    samples_per_prompt: int = flag("n_samples_per_prompt")
    global_batch_size: int = flag("global_batch_size")
    micro_batch_size: int = flag("micro_batch_size")
    token_budget: bool = flag("use_dynamic_batch_size")
    max_tokens_per_gpu: int | None = flag("max_tokens_per_gpu")
    log_probs_max_tokens_per_gpu: int | None = flag("log_probs_max_tokens_per_gpu")
    pass_layout: str = flag("pass_layout")
    steps_per_rollout: int = flag("num_steps_per_rollout")
    num_rollout: int | None = flag("num_rollout")
    num_epoch: int | None = flag("num_epoch")
    filter_path: str | None = flag("dynamic_sampling_filter_path")
    over_sampling_batch_size: int | None = flag("over_sampling_batch_size")
    max_rounds: int = flag("dynamic_sampling_max_rounds")


@dataclass(frozen=True)
class RolloutSection(Section):
    """What the rollout collects: prompts (files, reasoning-gym or the built-in task) or
    environment episodes, how it samples, and how it scores."""

    prompt_data: str | None = flag("prompt_data")
    builtin_task: str | None = flag("builtin_task")
    input_key: str = flag("input_key")
    label_key: str = flag("label_key")
    apply_chat_template: bool = flag("apply_chat_template")
    system_prompt: str | None = flag("system_prompt")
    shuffle: bool = flag("rollout_shuffle")
    max_response_len: int = flag("rollout_max_response_len")
    temperature: float = flag("rollout_temperature")
    top_p: float = flag("rollout_top_p")
    top_k: int = flag("rollout_top_k")
    rm_type: str | None = flag("rm_type")
    custom_rm_path: str | None = flag("custom_rm_path")
    reasoning_gym_answer: str = flag("reasoning_gym_answer")
    reward_timeout: float = flag("reward_timeout")
    reward_error_policy: str = flag("reward_error_policy")
    rm_url: str | None = flag("rm_url")
    reward_max_concurrency: int = flag("reward_max_concurrency")
    rm_batch_size: int = flag("rm_batch_size")
    rm_retries: int = flag("rm_retries")
    rm_retry_backoff: float = flag("rm_retry_backoff")
    group_rm: bool = flag("group_rm")
    genrm_model_path: str | None = flag("genrm_model_path")
    genrm_prompt_template: str | None = flag("genrm_prompt_template")
    genrm_max_response_len: int = flag("genrm_max_response_len")
    env: str | None = flag("env")
    max_turns: int = flag("max_turns")
    env_step_timeout: float | None = flag("env_step_timeout")
    agentic: bool = flag("use_agentic_rollout")
    agent_command: str | None = flag("agent_command")
    agent_timeout: float = flag("agent_timeout")
    log_samples: int = flag("log_samples")


@dataclass(frozen=True)
class LoraSection(Section):
    """Low-rank adapters (peft); ``rank`` 0 is full fine-tuning."""

    rank: int = flag("lora_rank")
    alpha: float = flag("lora_alpha")
    dropout: float = flag("lora_dropout")
    target_modules: tuple[str, ...] | None = flag("lora_target_modules")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass(frozen=True)
class RecomputeSection(Section):
    """Activation recompute of the policy's decoder layers (relax/trainer/recompute.py);
    ``granularity`` None is off."""

    granularity: str | None = flag("recompute_granularity")
    method: str | None = flag("recompute_method")
    num_layers: int | None = flag("recompute_num_layers")

    @property
    def enabled(self) -> bool:
        return self.granularity is not None


@dataclass(frozen=True)
class EvaluationSection(Section):
    """Evaluation as ``relax train --eval-interval`` and ``relax eval`` share it: the sets,
    the sampling (resolved: the rollout's settings where the flag was not given), the pass
    threshold and ``--env`` episodes. ``interval`` is None in ``relax eval``."""

    interval: int | None = flag("eval_interval", train_only=True)
    prompt_data: tuple[tuple[str, str], ...] | None = flag("eval_prompt_data")
    n_samples: int = flag("n_samples_per_eval_prompt")
    temperature: float = flag("eval_temperature")
    top_p: float = flag("eval_top_p")
    top_k: int = flag("eval_top_k")
    max_response_len: int = flag("eval_max_response_len")
    batch_size: int = flag("eval_batch_size")
    pass_threshold: float = flag("eval_pass_threshold")
    episodes: int = flag("eval_episodes")
    max_turns: int = flag("max_turns")
    env_step_timeout: float | None = flag("env_step_timeout")
    seed: int = flag("seed")
    bf16: bool | None = flag("bf16")


@dataclass(frozen=True)
class CheckpointSection(Section):
    """Where and when checkpoints are written and read (docs/reliability.md)."""

    save: str | None = flag("save")
    load: str | None = flag("load")
    save_interval: int | None = flag("save_interval")
    keep_last: int | None = flag("keep_last")
    async_save: bool = flag("async_save")
    checksums: bool = flag("checkpoint_checksums")
