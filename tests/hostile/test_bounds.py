"""Counts that ask for unbounded work are refused at validation, with the bound in the
message (docs/reliability.md, section 9): nothing is generated or built first."""

from __future__ import annotations

import pytest

from relax.config import ConfigError
from relax.config.bounds import MAX_ROUNDS, MAX_SAMPLES_PER_STEP, MAX_TURNS
from relax.config.gym_spec import MAX_SIZE
from tests.hostile.helpers import one_error_line, relax
from tests.trainer.helpers import make_config

FILTER = ["--dynamic-sampling-filter-path", "nonzero_std"]


@pytest.mark.parametrize("flags, words", [
    (["--rollout-batch-size", "1048576", "--n-samples-per-prompt", "2"],
     f"1048576 x 2 = 2097152 samples per rollout step, more than the bound of "
     f"{MAX_SAMPLES_PER_STEP}"),
    ([*FILTER, "--over-sampling-batch-size", "100000000"],
     f"samples per rollout step, more than the bound of {MAX_SAMPLES_PER_STEP}"),
    ([*FILTER, "--dynamic-sampling-max-rounds", "1000000"], f"must be <= {MAX_ROUNDS} rounds"),
    (["--env", "tests.agents.scripted:countdown", "--max-turns", "99999999"],
     f"must be <= {MAX_TURNS} model turns"),
    (["--rollout-max-response-len", "100000000"], "must be <= 1048576 tokens"),
    (["--env", "tests.agents.scripted:countdown", "--eval-interval", "1", "--eval-episodes",
      "100000000"], f"more than the bound of {MAX_SAMPLES_PER_STEP}"),
    (["--env", "tests.agents.scripted:countdown", "--env-step-timeout", "1e9"],
     "must lie in (0, 86400] seconds"),
    (["--env-step-timeout", "5"], "only applies to --env environments"),
])
def test_counts_past_their_bound_are_refused(flags, words, tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config(*flags, output_dir=tmp_path)
    assert words in str(e.value)


@pytest.mark.subprocess
def test_a_reasoning_gym_size_past_the_bound_stops_dry_run(tmp_path):
    out = relax("train", "--prompt-data", "reasoning-gym:chain_sum?size=100000000",
                "--dry-run", "--output-dir", tmp_path / "run", timeout=60)
    assert out.returncode == 2
    line = one_error_line(out)
    assert f"size must be an integer in [1, {MAX_SIZE}]" in line and "chain_sum" in line
