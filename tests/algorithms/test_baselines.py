"""Group baselines: REINFORCE++-baseline (reinforce_plus_plus.md §4) and the group-relative
family (§5)."""

import math

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside, out_dtype, random_mask

# Interleaved, non-contiguous group ids; group 9 has a single member.
GROUPS = [5, 2, 5, 2, 5, 2, 9, 5]
REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5, 3.0, -1.0]


def _mask(B=8, T=6, masked_rows=(4,)):
    return random_mask(np.random.default_rng(7), B, T, masked_rows=masked_rows)


def test_reference_baseline_by_hand():
    # group 5: {1, 0, 1, -1} mean 0.25 (row 4 is fully masked but counts);
    # group 2: {0, 1, 0.5} mean 0.5; group 9: {3} mean 3.
    mask = np.ones((8, 1), dtype=bool)
    got = ref.baseline_advantages(REWARDS, GROUPS, mask)[:, 0]
    np.testing.assert_allclose(got, [0.75, -0.5, -0.25, 0.5, 0.75, 0.0, 0.0, -1.25])


def test_reference_group_relative_by_hand():
    mask = np.ones((8, 1), dtype=bool)
    got = ref.group_relative_advantages(REWARDS, GROUPS, mask)[:, 0]
    std5 = np.std([1.0, 0.0, 1.0, -1.0], ddof=1)
    std2 = np.std([0.0, 1.0, 0.5], ddof=1)
    assert got[0] == pytest.approx(0.75 / (std5 + 1e-6))
    assert got[3] == pytest.approx(0.5 / (std2 + 1e-6))
    assert got[6] == 0.0


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_baseline_matches_reference(dtype):
    mask = _mask()
    R = torch.tensor(REWARDS, dtype=dtype)
    gi = torch.tensor(GROUPS, dtype=torch.int64)
    got = alg.reinforce_plus_plus_baseline_advantages(R, gi, mask)
    assert got.dtype == out_dtype(dtype)
    assert_ref(got, ref.baseline_advantages(R, gi, mask), dtype)
    assert_zero_outside(got, mask)
    # Fully masked row 4 still counts in group 5's mean: row 0 has C = 1 - 0.25 = 0.75.
    assert float(got[0][mask[0]][0]) == pytest.approx(0.75)


def test_baseline_has_no_std_division():
    # Scaling all rewards scales the raw advantage by the same factor (no std division).
    mask = torch.ones(4, 3, dtype=torch.bool)
    gi = torch.tensor([0, 0, 1, 1])
    R = torch.tensor([0.0, 1.0, 2.0, 6.0], dtype=torch.float64)
    a = alg.reinforce_plus_plus_baseline_advantages(R, gi, mask)
    b = alg.reinforce_plus_plus_baseline_advantages(10 * R, gi, mask)
    torch.testing.assert_close(b, 10 * a)
    assert_ref(a, [[-0.5] * 3, [0.5] * 3, [-2.0] * 3, [2.0] * 3], torch.float64)


def test_baseline_all_equal_rewards_zero():
    mask = _mask()
    got = alg.reinforce_plus_plus_baseline_advantages(torch.full((8,), 0.7),
                                                      torch.tensor(GROUPS), mask)
    assert bool((got == 0).all())


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("std_normalization", [True, False])
def test_group_relative_matches_reference(dtype, std_normalization):
    mask = _mask()
    R = torch.tensor(REWARDS, dtype=dtype)
    gi = torch.tensor(GROUPS)
    got = alg.group_relative_advantages(R, gi, mask, std_normalization=std_normalization)
    assert got.dtype == out_dtype(dtype)
    expected = ref.group_relative_advantages(R, gi, mask, std_normalization=std_normalization)
    assert_ref(got, expected, dtype)
    assert_zero_outside(got, mask)
    assert bool((got[6] == 0).all())  # group of one member -> 0


def test_group_relative_std_is_bessel_corrected_plus_eps():
    # Two members {0, 1}: ddof=1 std = sqrt(0.5); ddof=0 would give 0.5.
    mask = torch.ones(2, 1, dtype=torch.bool)
    got = alg.group_relative_advantages(torch.tensor([0.0, 1.0], dtype=torch.float64),
                                        torch.tensor([0, 0]), mask)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert float(got[1, 0]) == pytest.approx(expected, rel=1e-12)
    assert float(got[0, 0]) == pytest.approx(-expected, rel=1e-12)


def test_group_relative_equal_rewards_zero():
    got = alg.group_relative_advantages(torch.full((4,), 3.0), torch.tensor([0, 0, 1, 1]),
                                        torch.ones(4, 2, dtype=torch.bool))
    assert bool((got == 0).all())


@pytest.mark.parametrize("fn", ["reinforce_plus_plus_baseline_advantages",
                                "group_relative_advantages"])
def test_bad_inputs_name_the_argument(fn):
    f = getattr(alg, fn)
    m = torch.ones(4, 3, dtype=torch.bool)
    R = torch.zeros(4)
    gi = torch.tensor([0, 0, 1, 1])
    with pytest.raises(ValueError, match="rewards"):
        f(torch.zeros(5), gi, m)
    with pytest.raises(ValueError, match="group_index"):
        f(R, torch.tensor([0, 0, 1]), m)
    with pytest.raises(ValueError, match="group_index"):
        f(R, torch.tensor([0.0, 0.0, 1.0, 1.0]), m)


@pytest.mark.parametrize("fn", ["reinforce_plus_plus_baseline_advantages",
                                "group_relative_advantages"])
def test_numeric_mask_accepted(fn):
    f = getattr(alg, fn)
    mask = _mask()
    R = torch.tensor(REWARDS, dtype=torch.float64)
    a = f(R, torch.tensor(GROUPS, dtype=torch.int64), mask)
    b = f(R, torch.tensor(GROUPS, dtype=torch.int64), mask.to(torch.float32) * 3)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
