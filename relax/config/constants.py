"""Names the configuration validates against and the rollout implements, written once here so
that validation (which runs before torch is imported) needs nothing from relax.rollout.

- ``LIBRARIES``: ``--env PREFIX:ID`` prefix -> the module that must be installed
  (relax/rollout/agents/envs.py builds the environments);
- ``BUILTIN_FILTER_NAMES``: the short names ``--dynamic-sampling-filter-path`` accepts
  (relax/rollout/filters.py maps each to its function; a test keeps the two equal).
"""

from __future__ import annotations

LIBRARIES: dict[str, str] = {"gem": "gem", "textarena": "textarena"}
BUILTIN_FILTER_NAMES: tuple[str, ...] = ("nonzero_std", "check_reward_nonzero_std")
