"""Counts that ask for unbounded work are refused at validation, with the bound in the
message (docs/reliability.md, section 9): nothing is generated or built first."""

from __future__ import annotations

import pytest

from relax.config import ConfigError, parse_eval_config
from relax.config.gym_spec import MAX_SIZE
from relax.config.sections.batches import MAX_ROUNDS, MAX_SAMPLES_PER_STEP
from relax.config.sections.episodes import MAX_TURNS
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
    (["--env", "tests.rollout.agents.scripted:countdown", "--max-turns", "99999999"],
     f"must be <= {MAX_TURNS} model turns"),
    (["--rollout-max-response-len", "100000000"], "must be <= 1048576 tokens"),
    (["--env", "tests.rollout.agents.scripted:countdown", "--eval-interval", "1", "--eval-episodes",
      "100000000"], f"more than the bound of {MAX_SAMPLES_PER_STEP}"),
    (["--env", "tests.rollout.agents.scripted:countdown", "--env-step-timeout", "1e9"],
     "must lie in (0, 86400] seconds"),
    (["--env-step-timeout", "5"], "only applies to --env environments"),
])
def test_counts_past_their_bound_are_refused(flags, words, tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config(*flags, output_dir=tmp_path)
    assert words in str(e.value)


FLOAT32_RANGE = "the range of float32, the dtype of the tensors it is used with (0 or a " \
    "magnitude in [1.2e-38, 3.4e+38])"


@pytest.mark.parametrize("flags, words", [
    # a clamp bound beyond float32 was a RuntimeError traceback in the first step ("value
    # cannot be converted to type float without overflow")
    (["--use-tis", "--tis-clip", "1e308", "--tis-clip-low", "1e308"], "--tis-clip 1e+308: beyond"),
    (["--use-tis", "--tis-clip", "1e39"], "--tis-clip 1e+39: beyond"),
    (["--eps-clip-high", "1e308"], "--eps-clip-high 1e+308: beyond"),
    # an infinite coefficient or a temperature of 0 in float32 ended as "non-finite training
    # values ... try a lower --lr"
    (["--entropy-coef", "1e308"], "--entropy-coef 1e+308: beyond"),
    (["--use-kl-loss", "--kl-loss-coef", "1e300", "--kl-loss-type", "k2"],
     "--kl-loss-coef 1e+300: beyond"),
    (["--rollout-temperature", "1e-308"], "--rollout-temperature 1e-308: below"),
    (["--advantage-estimator", "sapo", "--sapo-tau-neg", "1e-300"], "--sapo-tau-neg 1e-300: below"),
    (["--lora-rank", "2", "--lora-alpha", "1e308"], "--lora-alpha 1e+308: beyond"),
    (["--lr", "1e308"], "--lr 1e+308: beyond"),
])
def test_float_flags_beyond_float32_are_refused(flags, words, tmp_path):
    with pytest.raises(ConfigError) as e:
        make_config(*flags, output_dir=tmp_path)
    assert words in str(e.value) and FLOAT32_RANGE in str(e.value)


def test_float32s_own_limits_are_accepted(tmp_path):
    biggest = "3.4028234663852886e38"
    cfg = make_config("--use-tis", "--tis-clip", biggest, "--tis-clip-low", biggest,
                      "--entropy-coef", "1.2e-38", output_dir=tmp_path)
    assert cfg.rollout.off_policy.tis_clip == float(biggest) and cfg.algorithm.entropy_coef == 1.2e-38
    with pytest.raises(ConfigError, match="--eval-temperature 1e-300: below the range of float32"):
        parse_eval_config([str(tmp_path), "--eval-temperature", "1e-300"])


@pytest.mark.subprocess
def test_tis_clips_beyond_float32_stop_relax_train_in_one_line(tmp_path):
    out = relax("train", "--use-tis", "--tis-clip", "1e308", "--tis-clip-low", "1e308",
                "--output-dir", tmp_path / "run", "--device", "cpu", timeout=120)
    assert out.returncode == 2
    assert one_error_line(out).startswith("relax train: error: --tis-clip 1e+308: beyond the "
                                          "range of float32")


@pytest.mark.subprocess
def test_a_reasoning_gym_size_past_the_bound_stops_dry_run(tmp_path):
    out = relax("train", "--prompt-data", "reasoning-gym:chain_sum?size=100000000",
                "--dry-run", "--output-dir", tmp_path / "run", timeout=60)
    assert out.returncode == 2
    line = one_error_line(out)
    assert f"size must be an integer in [1, {MAX_SIZE}]" in line and "chain_sum" in line
