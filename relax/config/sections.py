"""Every section of the configuration, by the name components import it under::

    cfg.algorithm     AlgorithmSection      cfg.rollout.data       DataSection
    cfg.model         ModelSection          cfg.rollout.sampling   SamplingSection
    cfg.batches       BatchSection          cfg.rollout.rewards    RewardsSection
    cfg.optimizer     OptimizerSection      cfg.rollout.episodes   EpisodesSection
    cfg.lora          LoraSection           cfg.rollout.off_policy OffPolicySection
    cfg.recompute     RecomputeSection      cfg.rollout.partial    PartialSection
    cfg.distillation  DistillationSection   cfg.rollout.backend    BackendSection
    cfg.critic        CriticSection         cfg.evaluation         EvaluationSection
    cfg.checkpoint    CheckpointSection     cfg.run                RunSection
    cfg.system        SystemSection         cfg.placement          PlacementSection

Torch-free.
"""

from __future__ import annotations

from relax.config.algorithm import AlgorithmSection
from relax.config.async_fields import PlacementSection
from relax.config.critic_fields import CriticSection
from relax.config.opd_fields import DistillationSection
from relax.config.reward_services import RewardsSection
from relax.config.rollout_backend import BackendSection
from relax.config.rollout_sections import (
    DataSection,
    EpisodesSection,
    OffPolicySection,
    PartialSection,
    RolloutSection,
    SamplingSection,
)
from relax.config.run_sections import (
    BatchSection,
    CheckpointSection,
    EvaluationSection,
    LoraSection,
    ModelSection,
    OptimizerSection,
    RecomputeSection,
    RunSection,
    SystemSection,
)

__all__ = [
    "AlgorithmSection", "BackendSection", "BatchSection", "CheckpointSection", "CriticSection",
    "DataSection", "DistillationSection", "EpisodesSection", "EvaluationSection", "LoraSection",
    "ModelSection", "OffPolicySection", "OptimizerSection", "PartialSection", "PlacementSection",
    "RecomputeSection", "RewardsSection", "RolloutSection", "RunSection", "SamplingSection",
    "SystemSection",
]
