"""Accepted configurations resolve unchanged: the recipes of reinforce_plus_plus.md §8, the
defaults of grpo/gspo/sapo, the built-in preset (and the user's flags winning over it)."""

from __future__ import annotations

import pytest

from relax.config import BUILTIN_PRESET, BUILTIN_TASK_NAMES, ESTIMATOR_NAMES, parse_train_config
from tests.flag_helpers import train_flags

RECIPE_RPP = ("--advantage-estimator reinforce_plus_plus --normalize-advantages "
              "--gamma 1.0 --kl-coef 0.01 --kl-loss-type k1").split()
RECIPE_BASE = ("--advantage-estimator reinforce_plus_plus_baseline --normalize-advantages "
               "--n-samples-per-prompt 8 --kl-coef 0 --use-kl-loss --kl-loss-type k2 "
               "--kl-loss-coef 0.01").split()

RPP_EXPECTED = dict(advantage_estimator="reinforce_plus_plus", normalize_advantages=True,
                    gamma=1.0, kl_coef=0.01, kl_loss_type="k1", use_kl_loss=False,
                    kl_loss_coef=0.0, calculate_per_token_loss=False, context_parallel_size=1,
                    fully_async=False, eps_clip=0.2,
                    eps_clip_high=0.2, eps_clip_c=None)
BASE_EXPECTED = dict(advantage_estimator="reinforce_plus_plus_baseline",
                     normalize_advantages=True, n_samples_per_prompt=8, kl_coef=0.0,
                     use_kl_loss=True, kl_loss_type="k2", kl_loss_coef=0.01,
                     calculate_per_token_loss=False, context_parallel_size=1, gamma=1.0)
# Relax defaults of the group-relative family (§5, §7), outside the built-in preset.
GROUP_DEFAULTS = dict(normalize_advantages=False, gamma=1.0, kl_coef=0.0, kl_loss_type="k1",
                      use_kl_loss=False, kl_loss_coef=0.0, entropy_coef=0.0, eps_clip=0.2,
                      eps_clip_high=0.2, eps_clip_c=None, sapo_tau_pos=1.0, sapo_tau_neg=1.05,
                      disable_grpo_std_normalization=False, calculate_per_token_loss=False,
                      custom_advantage_function_path=None, custom_reward_post_process_path=None,
                      n_samples_per_prompt=1, rollout_batch_size=8, global_batch_size=8,
                      micro_batch_size=8, num_steps_per_rollout=1, lr=1e-6,
                      rollout_max_response_len=1024, rollout_temperature=1.0,
                      rollout_top_p=1.0, rollout_top_k=-1, weight_decay=0.0, adam_beta1=0.9,
                      adam_beta2=0.999, clip_grad=1.0, seed=1234,
                      builtin_preset_applied=False, world_size=1)


def subset(cfg: dict, expected: dict) -> dict:
    return {k: cfg[k] for k in expected}


@pytest.mark.parametrize(("recipe", "expected"), [(RECIPE_RPP, RPP_EXPECTED),
                                                   (RECIPE_BASE, BASE_EXPECTED)])
def test_spec_recipes(cli, prompt_file, recipe, expected):
    # with the built-in task and preset, and with user data (no preset)
    for extra in ([], ["--prompt-data", prompt_file, "--rm-type", "math"]):
        cfg = cli(["train", *recipe, *extra, "--dry-run"]).config()
        assert subset(cfg, expected) == expected


@pytest.mark.parametrize("estimator", ["grpo", "gspo", "sapo"])
def test_group_family_defaults(cli, prompt_file, estimator):
    data = ["--prompt-data", prompt_file, "--rm-type", "math", "--dry-run"]
    cfg = cli(["train", "--advantage-estimator", estimator, *data]).config()
    assert subset(cfg, GROUP_DEFAULTS) == GROUP_DEFAULTS
    assert cfg["advantage_estimator"] == estimator
    if estimator == "grpo":  # grpo is the default estimator
        assert cli(["train", *data]).config() | {"output_dir": None} == cfg | {"output_dir": None}


def test_builtin_preset(cli, hf_dir, prompt_file):
    cfg = cli(["train", "--dry-run"]).config()
    assert cfg["builtin_preset_applied"] is True
    assert subset(cfg, BUILTIN_PRESET) == BUILTIN_PRESET
    # the user's explicit flags win, even when they equal the parser default
    cfg = cli(["train", "--lr", "1e-6", "--n-samples-per-prompt", "4", "--dry-run"]).config()
    assert (cfg["lr"], cfg["n_samples_per_prompt"]) == (1e-6, 4)
    assert cfg["rollout_batch_size"] == BUILTIN_PRESET["rollout_batch_size"]
    # a user model or user data turns the preset off
    for extra in (["--hf-checkpoint", hf_dir, "--num-rollout", "3"],
                  ["--prompt-data", prompt_file, "--rm-type", "math"]):
        cfg = cli(["train", *extra, "--dry-run"]).config()
        assert cfg["builtin_preset_applied"] is False
        assert (cfg["lr"], cfg["rollout_max_response_len"]) == (1e-6, 1024)


def test_preset_keys_are_flags():
    dests = {a.dest for a in train_flags().values()}
    assert set(BUILTIN_PRESET) <= dests
    assert {"lr", "rollout_batch_size", "n_samples_per_prompt", "num_rollout",
            "rollout_max_response_len", "builtin_task"} <= set(BUILTIN_PRESET)
    assert BUILTIN_PRESET["builtin_task"] in BUILTIN_TASK_NAMES


def test_parse_train_config_api(tmp_path):
    """The trainer-facing API: a Namespace with the resolved extras; ConfigError otherwise."""
    from relax.config import ConfigError

    cfg = parse_train_config(RECIPE_RPP, environ={"WORLD_SIZE": "2"})
    assert cfg.world_size == 2 and cfg.batches.micro_batch_size == cfg.batches.global_batch_size // 2
    with pytest.raises(ConfigError) as info:
        parse_train_config(["--advantage-estimator", "reinforce_plus_plus"], environ={})
    assert str(info.value).startswith("--advantage-estimator reinforce_plus_plus: ")
    assert info.value.flags == ["--advantage-estimator"]


def test_estimator_names_match_the_algorithm_registry():
    import relax.algorithms as algorithms

    assert set(ESTIMATOR_NAMES) == set(algorithms.ESTIMATORS)
