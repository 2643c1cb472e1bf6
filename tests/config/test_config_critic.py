"""reinforce_plus_plus.md §5c flags: each bad value is exit 2 with one line naming the flag,
before anything is loaded (``--dry-run`` resolves and prints the config only)."""

from __future__ import annotations

import pytest

PPO = ["--advantage-estimator", "ppo"]


def _rows(tmp_path):
    return {
        "lambd-above": ([*PPO, "--lambd", "1.5"], ("--lambd 1.5", "[0, 1]")),
        "lambd-below": ([*PPO, "--lambd", "-0.1"], ("--lambd -0.1", "[0, 1]")),
        "gamma-above": ([*PPO, "--gamma", "1.1"], ("--gamma 1.1", "(0, 1]")),
        "gamma-zero": ([*PPO, "--gamma", "0"], ("--gamma 0", "(0, 1]")),
        "negative-clip": ([*PPO, "--value-clip", "-0.2"], ("--value-clip -0.2", ">= 0")),
        "zero-lr": ([*PPO, "--critic-lr", "0"], ("--critic-lr 0", "> 0")),
        "negative-warmup": ([*PPO, "--critic-lr-warmup-iters", "-1"],
                            ("--critic-lr-warmup-iters -1", ">= 0")),
        "negative-critic-only": ([*PPO, "--num-critic-only-steps", "-1"],
                                 ("--num-critic-only-steps -1", ">= 0")),
        # settings that leave the policy nothing to do
        "all-critic-only": ([*PPO, "--num-critic-only-steps", "5", "--num-rollout", "2"],
                            ("--num-critic-only-steps 5 --num-rollout 2", "never train")),
        "as-many-critic-only": ([*PPO, "--num-critic-only-steps", "2", "--num-rollout", "2"],
                                ("--num-critic-only-steps 2 --num-rollout 2", "never train")),
        "no-critic-file": ([*PPO, "--critic-load", str(tmp_path)],
                           ("--critic-load", "no critic.pt and no checkpoint")),
        "lambd-without-ppo": (["--lambd", "0.9"], ("--lambd 0.9", "--advantage-estimator ppo")),
        "clip-without-ppo": (["--advantage-estimator", "grpo", "--value-clip", "0.5"],
                             ("--value-clip 0.5", "without a critic")),
    }


ROW_NAMES = ["lambd-above", "lambd-below", "gamma-above", "gamma-zero", "negative-clip",
             "zero-lr", "negative-warmup", "negative-critic-only", "all-critic-only",
             "as-many-critic-only", "no-critic-file",
             "lambd-without-ppo", "clip-without-ppo"]


@pytest.mark.parametrize("row", ROW_NAMES)
def test_bad_critic_flags_are_one_line(cli, rejected, row, tmp_path):
    flags, needles = _rows(tmp_path)[row]
    rejected(cli(["train", *flags, "--dry-run"]), *needles)


def test_the_critic_section_reads_the_flags(tmp_path):
    from relax.config import parse_train_config

    cfg = parse_train_config([*PPO, "--gamma", "0.99", "--lambd", "0.95", "--value-clip", "0.5",
                              "--critic-lr", "1e-5", "--critic-lr-warmup-iters", "3",
                              "--num-critic-only-steps", "2", "--critic-save",
                              str(tmp_path / "c")])
    c = cfg.critic
    assert (cfg.algorithm.gamma, cfg.algorithm.lambd, c.value_clip, c.critic_lr,
            c.critic_lr_warmup_iters, c.num_critic_only_steps, c.critic_save,
            c.critic_load) == (0.99, 0.95, 0.5, 1e-5, 3, 2, str(tmp_path / "c"), None)
