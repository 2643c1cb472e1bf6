"""relax/config/ stands below relax.rollout: validation runs before torch is imported, so the
names it checks against live in config and the rollout modules take them from there."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.subprocess
def test_config_imports_neither_rollout_nor_torch():
    code = ("import sys, relax.config, relax.config.validate, relax.config.eval_command; "
            "print(sorted(m for m in sys.modules if m.startswith('relax.rollout') "
            "or m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_the_rollout_implements_exactly_the_names_config_accepts():
    from relax.config.constants import BUILTIN_FILTER_NAMES, LIBRARIES
    from relax.rollout import filters
    from relax.rollout.agents import envs

    assert tuple(filters.BUILTIN_FILTERS) == BUILTIN_FILTER_NAMES
    assert envs.LIBRARIES is LIBRARIES


def test_the_rollout_reads_reasoning_gym_specs_with_configs_parser():
    from relax.config import gym_spec
    from relax.rollout.prompts import reasoning_gym_source

    assert reasoning_gym_source.parse_spec is gym_spec.parse_spec
    assert reasoning_gym_source.ANSWER_FORMATS == gym_spec.ANSWER_FORMATS
