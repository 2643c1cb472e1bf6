"""The configuration rules of rloo and cispo (reinforce_plus_plus.md §5a, §5b, §8): each
rejection from an accepted starting point (exit 2, one line naming the flag), and what they
accept."""

from __future__ import annotations

import pytest

from tests.config.test_config_rules import ACCEPTED, edit

ROWS = {
    "rloo-response-mean": ("rloo", (("-", "--calculate-per-token-loss"),),
                           ("--advantage-estimator rloo", "--calculate-per-token-loss")),
    "cispo-response-mean": ("cispo", (("-", "--calculate-per-token-loss"),),
                            ("--advantage-estimator cispo", "--calculate-per-token-loss")),
    "rloo-normalize": ("rloo", (("--normalize-advantages",),),
                       ("--normalize-advantages", "reward's scale")),
    "rloo-one-sample": ("rloo", (("--n-samples-per-prompt", "1"),),
                        ("--n-samples-per-prompt 1", "no group baseline")),
    "rloo-two-steps": ("rloo", (("--num-steps-per-rollout", "2"),),
                       ("--num-steps-per-rollout 2", "no importance ratio")),
    "rloo-smaller-global-batch": ("rloo", (("--global-batch-size", "64"),),
                                  ("--global-batch-size 64", "128")),
    "rloo-partial-rollout": ("rloo", (("--partial-rollout",), ("--over-sampling-batch-size", "32"),
                                      ("--use-tis",)), ("--partial-rollout", "older policy")),
    "rloo-rollout-logprobs": ("rloo", (("--use-rollout-logprobs",),),
                              ("--use-rollout-logprobs", "no pi_old")),
    "rloo-eps-clip": ("rloo", (("--eps-clip", "0.3"),), ("--eps-clip 0.3", "does not read")),
    "rloo-eps-clip-high": ("rloo", (("--eps-clip-high", "0.28"),), ("--eps-clip-high 0.28",)),
    "rloo-kl-coef": ("rloo", (("--kl-coef", "0.01"),), ("--kl-coef 0.01",)),
    "rloo-std-switch": ("rloo", (("--disable-grpo-std-normalization",),),
                        ("--disable-grpo-std-normalization", "§5a")),
    "rloo-gamma": ("rloo", (("--gamma", "0.9"),), ("--gamma 0.9",)),
    "cispo-dual-clip": ("cispo", (("--eps-clip-c", "3"),), ("--eps-clip-c 3", "does not read")),
    "cispo-sapo-tau": ("cispo", (("--sapo-tau-pos", "2"),), ("--sapo-tau-pos 2",)),
    "cispo-kl-coef": ("cispo", (("--kl-coef", "0.01"),), ("--kl-coef 0.01",)),
    "cispo-eps-clip-one": ("cispo", (("--eps-clip", "1"),), ("--eps-clip 1", "(0, 1)")),
}


@pytest.mark.parametrize("row", ROWS)
def test_rejections(cli, rejected, row):
    estimator, changes, needles = ROWS[row]
    rejected(cli(["train", *edit(ACCEPTED[estimator], *changes), "--dry-run"]), *needles)


ACCEPTS = {
    # the KL loss of any type, both corrections for the sampler, dynamic sampling and the plug-ins
    "rloo": ["--use-kl-loss", "--kl-loss-type", "k3", "--kl-loss-coef", "0.001", "--use-tis",
             "--use-opsm", "--dynamic-sampling-filter-path", "nonzero_std",
             "--custom-reward-post-process-path", "json:loads",
             "--custom-advantage-function-path", "json:loads", "--global-batch-size", "128",
             "--num-steps-per-rollout", "1", "--micro-batch-size", "4"],
    # Relax's recipe: --eps-clip-high 10, a small KL loss, TIS; several optimizer steps are fine
    # (the weight is the ratio's correction)
    "cispo": ["--eps-clip", "0.2", "--eps-clip-high", "10", "--use-kl-loss", "--kl-loss-coef",
              "0.001", "--use-tis", "--num-steps-per-rollout", "2", "--normalize-advantages",
              "--disable-grpo-std-normalization", "--use-opsm"],
}


@pytest.mark.parametrize("estimator", ACCEPTS)
def test_accepted(cli, estimator):
    cfg = cli(["train", *ACCEPTED[estimator], *ACCEPTS[estimator], "--dry-run"]).config()
    assert cfg["advantage_estimator"] == estimator and cfg["calculate_per_token_loss"]


def test_cispo_with_the_sampler_as_pi_old(cli):
    argv = ["train", *ACCEPTED["cispo"], "--use-rollout-logprobs", "--dry-run"]
    assert cli(argv).config()["use_rollout_logprobs"]
