"""The rollout section (``cfg.rollout``): where prompts come from (``data``), how responses
are sampled (``sampling``), scored (``rewards``), played as episodes (``episodes``), corrected
off-policy (``off_policy``, reinforce_plus_plus.md §7a, §7c), carried over unfinished
(``partial``), kept in length (``length``, §7d), and who samples (``backend``); each part in its own module of this package. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from relax.config.section import Section, section
from relax.config.sections.backend import BackendSection
from relax.config.sections.data import DataSection
from relax.config.sections.episodes import EpisodesSection
from relax.config.sections.length import LengthSection
from relax.config.sections.off_policy import OffPolicySection
from relax.config.sections.partial import PartialSection
from relax.config.sections.rewards import RewardsSection
from relax.config.sections.sampling import SamplingSection


@dataclass(frozen=True)
class RolloutSection(Section):
    """What the rollout collects, how it samples and scores, and who samples."""

    data: DataSection = section(DataSection)
    sampling: SamplingSection = section(SamplingSection)
    rewards: RewardsSection = section(RewardsSection)
    episodes: EpisodesSection = section(EpisodesSection)
    off_policy: OffPolicySection = section(OffPolicySection)
    partial: PartialSection = section(PartialSection)
    length: LengthSection = section(LengthSection)
    backend: BackendSection = section(BackendSection)

