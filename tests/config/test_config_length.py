"""reinforce_plus_plus.md §7d flags: each bad value is exit 2 with one line naming the flag,
and what composes with the frozen REINFORCE++ variants."""

from __future__ import annotations

import pytest

RPP = ["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages", "--gamma",
       "1.0", "--kl-coef", "0.01", "--kl-loss-type", "k1"]
BASELINE = ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
            "--n-samples-per-prompt", "8", "--kl-coef", "0", "--use-kl-loss", "--kl-loss-type",
            "k2", "--kl-loss-coef", "0.01"]

ROWS = {
    "buffer-zero": (["--overlong-buffer-len", "0"], ("--overlong-buffer-len 0", "must be > 0")),
    "buffer-beyond-limit": (["--overlong-buffer-len", "9", "--rollout-max-response-len", "8"],
                            ("--overlong-buffer-len 9", "--rollout-max-response-len 8",
                             "at most 8")),
    "factor-negative": (["--overlong-buffer-len", "2", "--overlong-penalty-factor", "-1"],
                        ("--overlong-penalty-factor -1", ">= 0")),
    "factor-without-buffer": (["--overlong-penalty-factor", "2"],
                              ("--overlong-penalty-factor 2", "without --overlong-buffer-len")),
    "length-negative": (["--length-penalty-coef", "-0.1"], ("--length-penalty-coef -0.1",)),
    "shaping-with-env": (["--length-penalty-coef", "0.1", "--env",
                          "tests.rollout.agents.scripted:ragged"],
                         ("--length-penalty-coef 0.1", "--env", "an episode's length")),
    "filter-with-reward-kl": ([*RPP, "--overlong-filter"],
                              ("--overlong-filter", "--kl-coef 0.01", "lose its KL penalty")),
}


@pytest.mark.parametrize("row", ROWS)
def test_bad_length_flags_are_one_line(cli, rejected, row):
    flags, needles = ROWS[row]
    rejected(cli(["train", *flags, "--dry-run"]), *needles)


@pytest.mark.parametrize("flags", [
    [*RPP, "--overlong-buffer-len", "2", "--length-penalty-coef", "0.1"],
    [*BASELINE, "--overlong-buffer-len", "2", "--overlong-filter", "--length-penalty-coef", "0.1"],
    [*RPP, "--kl-coef", "0", "--overlong-filter"],
])
def test_the_frozen_variants_take_the_length_controls_that_keep_their_math(cli, flags):
    """The penalties change R_i, the contract's input; the filter zeroes advantages after
    the estimator, as OPSM drops rows (reinforce_plus_plus.md §7d)."""
    cfg = cli(["train", *flags, "--dry-run"]).config()
    assert cfg["overlong_filter"] or cfg["overlong_buffer_len"] == 2
