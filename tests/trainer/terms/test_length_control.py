"""Length control in the loop (reinforce_plus_plus.md §7d): the penalties the estimator reads,
the filter's advantage 0, their metrics, and tiny-model runs (packed passes, a seeded repeat)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from relax.config.sections import LengthSection
from relax.metrics.tracker import MetricTracker
from relax.trainer.terms.length_control import LengthControl
from tests.trainer.helpers import RECIPES, fit, make_config, write_reward


def _batch(lengths, truncated, carried=None):
    """A batch whose rows generated ``lengths`` tokens; ``carried``: how many of them an
    earlier step sampled (a partial rollout leaving them out of the loss mask)."""
    T = 8
    context = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    trained = context.clone()
    if carried is not None:
        trained &= torch.arange(T)[None, :] >= torch.tensor(carried)[:, None]
    rollout = SimpleNamespace(response_mask=trained,
                              context_mask=None if carried is None else context,
                              truncated=torch.tensor(truncated))
    return SimpleNamespace(rollout=rollout)


def test_the_penalties_are_added_to_the_rewards():
    """max_len 8, buffer 3: no penalty up to 5 tokens, -f/3 per token beyond, -f at 8; the
    length penalty -c L / 8; a partial rollout's carried tokens count."""
    term = LengthControl(LengthSection(overlong_buffer_len=3, overlong_penalty_factor=0.6,
                                       length_penalty_coef=0.2), max_len=8)
    rewards = torch.tensor([1.0, 0.0, 0.5, 1.0])
    lengths = [5, 6, 8, 7]
    tracker = MetricTracker()
    got = term.shape_rewards(rewards, _batch(lengths, [False, False, True, False],
                                              carried=[0, 2, 4, 6]), tracker)
    overlong = [0.0, -0.2, -0.6, -0.4]
    length = [-0.2 * L / 8 for L in lengths]
    want = [r + o + p for r, o, p in zip(rewards.tolist(), overlong, length, strict=True)]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    metrics = tracker.reduce()
    assert metrics["rollout/overlong_penalty"] == pytest.approx(sum(overlong) / 4, rel=1e-6)
    assert metrics["rollout/length_penalty"] == pytest.approx(sum(length) / 4, rel=1e-6)


def test_the_filter_zeroes_the_advantages_of_truncated_rows():
    term = LengthControl(LengthSection(overlong_filter=True), max_len=8)
    tracker = MetricTracker()
    rewards = torch.tensor([1.0, 0.0, 0.5])
    assert term.shape_rewards(rewards, _batch([3, 8, 8], [False, True, True]), tracker) is rewards
    exp = SimpleNamespace(advantages=torch.ones(3, 8))
    term.shape_advantages(exp, None, tracker)
    assert exp.advantages.sum(-1).tolist() == [8.0, 0.0, 0.0]
    assert tracker.reduce()["rollout/overlong_filtered_fraction"] == pytest.approx(2 / 3)


def test_nothing_is_built_without_a_length_flag():
    assert LengthControl.build(LengthSection(), max_len=8) is None


def test_a_tiny_run_with_the_overlong_punishment_and_the_length_penalty(tmp_path):
    """A buffer as long as the limit: the punishment is linear in the length, so its mean is
    the mean length's (-factor * L / 4, as the length penalty's -coef * L / 4)."""
    reward = write_reward(tmp_path)
    cfg = make_config(*RECIPES["grpo"], "--custom-rm-path", f"{reward}:parity",
                      "--overlong-buffer-len", "4", "--overlong-penalty-factor", "0.5",
                      "--length-penalty-coef", "0.25", "--pass-layout", "packed",
                      output_dir=tmp_path / "run")
    _, history, moved = fit(cfg)
    assert moved > 0
    for row in history:
        length = row["rollout/response_length"]
        assert length > 0
        assert row["rollout/overlong_penalty"] == pytest.approx(-0.5 * length / 4, rel=1e-6)
        assert row["rollout/length_penalty"] == pytest.approx(-0.25 * length / 4, rel=1e-6)


def test_a_tiny_run_with_the_overlong_filter_repeats_exactly(tmp_path):
    """The filtered share is the truncated share of the trained responses; with every
    response filtered the policy loss is 0. Two seeded runs are the same run."""
    reward = write_reward(tmp_path)
    flags = (*RECIPES["reinforce_plus_plus_baseline"], "--custom-rm-path",
             f"{reward}:parity", "--overlong-filter", "--overlong-buffer-len", "2",
             "--seed", "4")
    first = fit(make_config(*flags, output_dir=tmp_path / "a"))[1]
    second = fit(make_config(*flags, output_dir=tmp_path / "b"))[1]
    for row in first:
        assert row["rollout/overlong_filtered_fraction"] == pytest.approx(row["rollout/truncated"])
        if row["rollout/overlong_filtered_fraction"] == 1.0:
            assert row["train/pg_loss"] == 0.0
    assert {row["rollout/overlong_filtered_fraction"] == 1.0 for row in first} == {True, False}
    keep = [k for k in first[0] if not k.startswith("perf/")]
    assert [{k: r[k] for k in keep} for r in first] == [{k: r[k] for k in keep} for r in second]
