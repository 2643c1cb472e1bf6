"""Every section of the configuration, one module each, holding its fields (flag, default,
help, bound, what it needs: ``option()``), its own rules (``Section.check``) and the rules
across sections it leads (listed in order in relax/config/validate.py)::

    cfg.algorithm     algorithm.py      cfg.rollout.data       data.py
    cfg.model         model.py          cfg.rollout.sampling   sampling.py
    cfg.batches       batches.py        cfg.rollout.rewards    rewards.py
    cfg.optimizer     optimizer.py      cfg.rollout.episodes   episodes.py
    cfg.lora          lora.py           cfg.rollout.off_policy off_policy.py
    cfg.recompute     recompute.py      cfg.rollout.partial    partial.py
    cfg.distillation  distillation.py   cfg.rollout.backend    backend.py
    cfg.critic        critic.py         cfg.rollout.length     length.py
                                        cfg.rollout            rollout.py
    cfg.checkpoint    checkpoint.py     cfg.evaluation         evaluation.py
    cfg.system        system.py         cfg.run                run.py
    cfg.placement     placement.py

Torch-free.
"""

from __future__ import annotations

from relax.config.sections.algorithm import AlgorithmSection
from relax.config.sections.backend import BackendSection
from relax.config.sections.batches import BatchSection
from relax.config.sections.checkpoint import CheckpointSection
from relax.config.sections.critic import CriticSection
from relax.config.sections.data import DataSection
from relax.config.sections.distillation import DistillationSection
from relax.config.sections.episodes import EpisodesSection
from relax.config.sections.evaluation import EvaluationSection
from relax.config.sections.length import LengthSection
from relax.config.sections.lora import LoraSection
from relax.config.sections.model import ModelSection
from relax.config.sections.off_policy import OffPolicySection
from relax.config.sections.optimizer import OptimizerSection
from relax.config.sections.partial import PartialSection
from relax.config.sections.placement import PlacementSection
from relax.config.sections.recompute import RecomputeSection
from relax.config.sections.rewards import RewardsSection
from relax.config.sections.rollout import RolloutSection
from relax.config.sections.run import RunSection
from relax.config.sections.sampling import SamplingSection
from relax.config.sections.system import SystemSection

__all__ = [
    "AlgorithmSection", "BackendSection", "BatchSection", "CheckpointSection", "CriticSection",
    "DataSection", "DistillationSection", "EpisodesSection", "EvaluationSection", "LengthSection",
    "LoraSection",
    "ModelSection", "OffPolicySection", "OptimizerSection", "PartialSection", "PlacementSection",
    "RecomputeSection", "RewardsSection", "RolloutSection", "RunSection", "SamplingSection",
    "SystemSection",
]
