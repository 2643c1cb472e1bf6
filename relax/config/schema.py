"""The configuration of ``relax train`` and ``relax eval``: a tree of frozen sections.

    cfg.algorithm.advantage_estimator          # --advantage-estimator
    cfg.rollout.sampling.rollout_temperature   # --rollout-temperature
    cfg.checkpoint.save_interval               # --save-interval

Each leaf field declares its flag, default, help, bound and needs once, in its section's
module (relax/config/sections/; the machinery: relax/config/section.py);
the parsers (relax/config/flags.py), ``--help`` grouped by section, the dry run and
``config.json`` (by section), the ``--config`` file loader (relax/config/files.py) and
docs/configuration.md's check are built from them. A config is built once, after the built-in
preset is applied, and never changed afterwards: resolution makes a new one
(:func:`~relax.config.section.replace_flat`). Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from relax.config.section import derived, option, section
from relax.config.sections import (
    AlgorithmSection,
    BatchSection,
    CheckpointSection,
    CriticSection,
    DistillationSection,
    EvaluationSection,
    LoraSection,
    ModelSection,
    OptimizerSection,
    PlacementSection,
    RecomputeSection,
    RolloutSection,
    RunSection,
    SystemSection,
)


@dataclass(frozen=True)
class TrainConfig:
    """``relax train`` settings (rules: reinforce_plus_plus.md §8 and relax/config/validate.py)."""

    algorithm: AlgorithmSection = section(AlgorithmSection)
    model: ModelSection = section(ModelSection)
    rollout: RolloutSection = section(RolloutSection)
    batches: BatchSection = section(BatchSection)
    optimizer: OptimizerSection = section(OptimizerSection)
    lora: LoraSection = section(LoraSection)
    recompute: RecomputeSection = section(RecomputeSection)
    distillation: DistillationSection = section(DistillationSection)
    critic: CriticSection = section(CriticSection)
    evaluation: EvaluationSection = section(EvaluationSection)
    checkpoint: CheckpointSection = section(CheckpointSection)
    run: RunSection = section(RunSection)
    system: SystemSection = section(SystemSection)
    placement: PlacementSection = section(PlacementSection)

    # resolved, not flags
    world_size: int = derived(1, "Data-parallel ranks (WORLD_SIZE).")
    builtin_preset_applied: bool = derived(False, "Whether the built-in preset set defaults.")

    def to_dict(self) -> dict:
        """By section, as config.json and ``--dry-run`` write it."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class EvalConfig:
    """``relax eval CHECKPOINT`` settings: the sections ``relax train`` has, of which only the
    flags of :data:`EVAL_FLAGS` are on its command line (rules: relax/config/eval_command.py)."""

    checkpoint: str = option(
        "", "A --save directory of relax train (its final model), a directory written by "
        "relax export, or any Hugging Face causal LM directory.", metavar="CHECKPOINT",
        positional=True)
    evaluation: EvaluationSection = section(EvaluationSection)
    rollout: RolloutSection = section(RolloutSection)
    run: RunSection = section(RunSection)
    system: SystemSection = section(SystemSection)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ``relax eval``'s flags (dests), in the order of its --help: the one table of which fields the
# eval command has (every field is a flag of relax train)
EVAL_FLAGS: tuple[str, ...] = (
    "checkpoint", "eval_prompt_data", "n_samples_per_eval_prompt", "eval_temperature",
    "eval_top_p", "eval_top_k", "eval_max_response_len", "eval_batch_size",
    "eval_pass_threshold", "eval_episodes", "input_key", "label_key", "rm_type",
    "custom_rm_path", "apply_chat_template", "system_prompt", "reasoning_gym_answer",
    "builtin_task", "env", "max_turns", "env_step_timeout", "rollout_backend", "vllm_url",
    "vllm_startup_timeout", "vllm_request_timeout", "seed", "output_dir", "bf16", "device",
    "host_mmap_threshold_kb",
)
