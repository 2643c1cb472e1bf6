"""reinforce_plus_plus.md §7a flags: each bad value is exit 2 with one line naming the flag."""

from __future__ import annotations

import pytest

ROWS = {
    "clip-zero": (["--use-tis", "--tis-clip", "0"], ("--tis-clip 0", "must be > 0")),
    "clip-negative": (["--use-tis", "--tis-clip", "-1"], ("--tis-clip -1",)),
    "low-above-high": (["--use-tis", "--tis-clip", "1.5", "--tis-clip-low", "2"],
                       ("--tis-clip-low 2", "--tis-clip 1.5", "[0, --tis-clip]")),
    "low-negative": (["--use-tis", "--tis-clip-low", "-0.1"], ("--tis-clip-low -0.1",)),
    "clip-without-tis": (["--tis-clip", "3"], ("--tis-clip 3", "without --use-tis")),
    "plugin-without-tis": (["--custom-tis-function-path", "math:sqrt"],
                           ("--custom-tis-function-path", "without --use-tis")),
    "plugin-missing": (["--use-tis", "--custom-tis-function-path", "/nowhere/tis.py:f"],
                       ("--custom-tis-function-path /nowhere/tis.py:f",)),
    "plugin-malformed": (["--use-tis", "--custom-tis-function-path", "tis"],
                         ("--custom-tis-function-path tis", "module:function")),
    "delta-zero": (["--use-opsm", "--opsm-delta", "0"], ("--opsm-delta 0", "must be > 0")),
    "delta-without-opsm": (["--opsm-delta", "0.1"], ("--opsm-delta 0.1", "without --use-opsm")),
    "partial-without-over-sampling": (["--partial-rollout", "--use-tis"],
                                      ("--partial-rollout", "--over-sampling-batch-size")),
    "partial-over-not-above": (["--partial-rollout", "--use-tis", "--rollout-batch-size", "4",
                                "--over-sampling-batch-size", "4"],
                               ("--over-sampling-batch-size 4", "above --rollout-batch-size")),
    "partial-uncorrected": (["--partial-rollout", "--rollout-batch-size", "4",
                             "--over-sampling-batch-size", "8"],
                            ("--partial-rollout", "--mask-offpolicy-in-partial-rollout")),
    "partial-with-agents": (["--partial-rollout", "--use-tis", "--rollout-batch-size", "4",
                             "--over-sampling-batch-size", "8", "--use-agentic-rollout",
                             "--agent-command", "true"],
                            ("--partial-rollout", "--use-agentic-rollout", "agent program's "
                             "process", "a checkpoint cannot hold")),
    "partial-aborted-zero": (["--partial-rollout", "--use-tis", "--rollout-batch-size", "4",
                              "--over-sampling-batch-size", "8",
                              "--partial-rollout-max-aborted-count", "0"],
                             ("--partial-rollout-max-aborted-count 0", ">= 1")),
    "mask-without-partial": (["--mask-offpolicy-in-partial-rollout"],
                             ("--mask-offpolicy-in-partial-rollout", "without --partial-rollout")),
    "tis-with-rollout-logprobs": (["--use-tis", "--use-rollout-logprobs"],
                                  ("--use-tis", "--use-rollout-logprobs", "every TIS weight is 1")),
    # §7c: the rollout correction family
    "is-bad-level": (["--rollout-is", "row"], ("--rollout-is", "row")),
    "is-threshold-one": (["--rollout-is", "token", "--rollout-is-threshold", "1"],
                         ("--rollout-is-threshold 1", "must be > 1")),
    "is-lower-one": (["--rollout-is", "token", "--rollout-is-threshold-lower", "1"],
                     ("--rollout-is-threshold-lower 1", "[0, 1)")),
    "is-mode-without-is": (["--rollout-is-mode", "mask"],
                           ("--rollout-is-mode mask", "without --rollout-is")),
    "is-with-rollout-logprobs": (["--rollout-is", "sequence", "--use-rollout-logprobs"],
                                 ("--rollout-is sequence", "--use-rollout-logprobs",
                                  "every ratio pi_old / pi_sampler is 1")),
    "is-with-tis": (["--rollout-is", "token", "--use-tis"],
                    ("--rollout-is token", "--use-tis", "two importance weights")),
    "rs-with-rollout-logprobs": (["--rollout-rs", "token", "--use-rollout-logprobs"],
                                 ("--rollout-rs token", "--use-rollout-logprobs")),
    "veto-with-rollout-logprobs": (["--rollout-token-veto-threshold", "0.01",
                                    "--use-rollout-logprobs"],
                                   ("--rollout-token-veto-threshold 0.01",)),
    "rs-bounds-miss-one": (["--rollout-rs", "geometric", "--rollout-rs-threshold", "0.9"],
                           ("--rollout-rs-threshold 0.9", "must hold 1")),
    "rs-lower-with-k3": (["--rollout-rs", "k3", "--rollout-rs-threshold-lower", "0.5"],
                         ("--rollout-rs-threshold-lower 0.5", "from above only")),
    "rs-lower-zero": (["--rollout-rs", "token", "--rollout-rs-threshold-lower", "0"],
                      ("--rollout-rs-threshold-lower 0", "(0, 1)")),
    "rs-threshold-without-rs": (["--rollout-rs-threshold", "3"],
                                ("--rollout-rs-threshold 3", "without --rollout-rs")),
    "veto-one": (["--rollout-token-veto-threshold", "1"],
                 ("--rollout-token-veto-threshold 1", "(0, 1)")),
}


def test_a_rollout_correction_counts_as_the_correction_staleness_needs(cli):
    """--fully-async K >= 1 and partial rollouts accept a §7c correction where they ask for
    one; its defaults resolve (a ratio rule's lower bound is 1 / its upper)."""
    cfg = cli(["train", "--partial-rollout", "--rollout-rs", "token", "--rollout-batch-size",
               "4", "--over-sampling-batch-size", "8", "--dry-run"]).config()
    assert cfg["rollout_rs"] == "token" and cfg["rollout_rs_threshold"] is None
    from relax.config.sections import OffPolicySection
    assert OffPolicySection(rollout_rs="token").rs_bounds() == (0.5, 2.0)
    assert OffPolicySection(rollout_rs="k3").rs_bounds() == (0.0, 0.01)
    assert OffPolicySection(rollout_rs="sequence", rollout_rs_threshold=4.0,
                            rollout_rs_threshold_lower=0.1).rs_bounds() == (0.1, 4.0)


@pytest.mark.parametrize("row", ROWS)
def test_bad_off_policy_flags_are_one_line(cli, rejected, row):
    flags, needles = ROWS[row]
    rejected(cli(["train", *flags, "--dry-run"]), *needles)


def test_partial_rollouts_take_a_filter_and_env_episodes(cli):
    cfg = cli(["train", "--partial-rollout", "--use-tis", "--rollout-batch-size", "4",
               "--over-sampling-batch-size", "8", "--n-samples-per-prompt", "2",
               "--dynamic-sampling-filter-path", "nonzero_std", "--dry-run"]).config()
    assert cfg["partial_rollout"] and cfg["dynamic_sampling_filter_path"] == "nonzero_std"
    cfg = cli(["train", "--partial-rollout", "--use-tis", "--rollout-batch-size", "4",
               "--over-sampling-batch-size", "8", "--env", "tests.rollout.agents.scripted:ragged",
               "--dry-run"]).config()
    assert cfg["partial_rollout"] and cfg["env"] == "tests.rollout.agents.scripted:ragged"


def test_good_off_policy_flags_resolve(cli):
    cfg = cli(["train", "--use-tis", "--tis-clip", "1.5", "--tis-clip-low", "0.5", "--use-opsm",
               "--dry-run"]).config()
    assert (cfg["use_tis"], cfg["tis_clip"], cfg["tis_clip_low"]) == (True, 1.5, 0.5)
    assert cfg["use_opsm"] and cfg["get_mismatch_metrics"] is True  # on unless turned off
    off = cli(["train", "--no-get-mismatch-metrics", "--use-rollout-logprobs",
               "--dry-run"]).config()
    assert off["get_mismatch_metrics"] is False and off["use_rollout_logprobs"]
