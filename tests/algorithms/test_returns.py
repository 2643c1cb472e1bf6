"""REINFORCE++ returns (reinforce_plus_plus.md §3) against the float64 reference."""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import (
    SENTINELS,
    assert_ref,
    assert_zero_outside,
    out_dtype,
    poison,
    random_mask,
)

NAN = float("nan")


def _hand_case():
    # One response, positions 0..4, mask [1,1,0,1,0] (a hole at 2, padding at 4).
    # d = old - ref = [1, 2, *, 3, *], beta = 0.1, R = 1, gamma = 0.5:
    # r = [-0.1, -0.2, 0, 0.7, 0]; the hole still takes a discount step, so
    # G3 = 0.7, acc2 = 0.35, G1 = -0.2 + 0.175 = -0.025, G0 = -0.1 - 0.0125 = -0.1125.
    old = [[1.0, 2.0, NAN, 3.0, float("inf")]]
    refl = [[0.0, 0.0, -1e30, 0.0, NAN]]
    mask = [[True, True, False, True, False]]
    expected = [[-0.1125, -0.025, 0.0, 0.7, 0.0]]
    return [1.0], old, refl, mask, expected


def test_reference_by_hand():
    R, old, refl, mask, expected = _hand_case()
    got = ref.rpp_returns(R, old, refl, np.array(mask), kl_coef=0.1, gamma=0.5)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_by_hand(dtype):
    R, old, refl, mask, expected = _hand_case()
    got = alg.reinforce_plus_plus_returns(
        torch.tensor(R, dtype=dtype), torch.tensor(old, dtype=dtype),
        torch.tensor(refl, dtype=dtype), torch.tensor(mask), kl_coef=0.1, gamma=0.5)
    assert got.dtype == out_dtype(dtype)
    assert_ref(got, expected, dtype, what="hand case")
    assert_zero_outside(got, torch.tensor(mask))


def _batch(seed, B, T, dtype, masked_rows=()):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    R = torch.tensor(rng.choice([0.0, 1.0, -0.5, 2.0], size=B), dtype=dtype)
    old = torch.tensor(rng.normal(-1.5, 1.0, size=(B, T)), dtype=dtype)
    refl = torch.tensor(rng.normal(-1.5, 1.0, size=(B, T)), dtype=dtype)
    return rng, R, old, refl, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.9])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_matches_reference(dtype, gamma, beta):
    rng, R, old, refl, mask = _batch(1, 6, 17, dtype, masked_rows=(3,))
    old_p, ref_p = poison(old, mask, rng=rng), poison(refl, mask, rng=rng)
    got = alg.reinforce_plus_plus_returns(R, old_p, ref_p, mask, kl_coef=beta, gamma=gamma)
    assert got.dtype == out_dtype(dtype)
    expected = ref.rpp_returns(R, old, refl, mask, kl_coef=beta, gamma=gamma)
    assert_ref(got, expected, dtype, what=f"G gamma={gamma} beta={beta}")
    assert_zero_outside(got, mask)
    assert bool((got[3] == 0).all())
    # Clean inputs (zeros outside the mask) give the same values as the poisoned ones.
    clean = alg.reinforce_plus_plus_returns(R, old.masked_fill(~mask, 0), refl.masked_fill(~mask, 0),
                                            mask, kl_coef=beta, gamma=gamma)
    torch.testing.assert_close(got, clean, rtol=1e-6, atol=1e-6)


def test_discount_counts_positions_including_holes():
    # Reward 1 at the last valid position t=5, a hole at 2..4: G0 = gamma^5, not gamma^2.
    mask = torch.tensor([[1, 1, 0, 0, 0, 1, 0]], dtype=torch.bool)
    z = torch.zeros(1, 7, dtype=torch.float64)
    got = alg.reinforce_plus_plus_returns(torch.tensor([1.0], dtype=torch.float64), z, z, mask,
                                          kl_coef=0.0, gamma=0.9)
    expected = [[0.9**5, 0.9**4, 0, 0, 0, 1.0, 0]]
    assert_ref(got, expected, torch.float64)


def test_zero_rewards_with_kl_give_finite_nonzero_returns():
    rng, R, old, refl, mask = _batch(2, 4, 9, torch.float32)
    R = torch.zeros_like(R)
    got = alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.01, gamma=1.0)
    assert bool(torch.isfinite(got).all())
    assert bool((got[mask] != 0).any())
    assert_ref(got, ref.rpp_returns(R, old, refl, mask, kl_coef=0.01), torch.float32)


@pytest.mark.parametrize("sentinel", SENTINELS)
def test_fully_masked_rows_ignore_their_reward(sentinel):
    # §1: a fully masked response yields all-zero returns, whatever is stored for it.
    rng, R, old, refl, mask = _batch(3, 5, 8, torch.float32, masked_rows=(0, 4))
    R_p = R.clone()
    R_p[0], R_p[4] = sentinel, sentinel
    got = alg.reinforce_plus_plus_returns(R_p, poison(old, mask, sentinel),
                                          poison(refl, mask, sentinel), mask, kl_coef=0.01,
                                          gamma=0.99)
    assert bool((got[0] == 0).all()) and bool((got[4] == 0).all())
    assert_ref(got, ref.rpp_returns(R, old, refl, mask, kl_coef=0.01, gamma=0.99), torch.float32)


def test_all_rows_masked_gives_zeros():
    mask = torch.zeros(3, 4, dtype=torch.bool)
    x = torch.full((3, 4), NAN)
    got = alg.reinforce_plus_plus_returns(torch.ones(3), x, x, mask, kl_coef=0.01, gamma=0.9)
    assert bool((got == 0).all())


@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.9, 0.5])
def test_long_sequence_float32_accuracy(gamma):
    """T = 8192 float32 within 1e-4 of the float64 definition, relative to the scale.

    Tolerance: |G32 - G64| <= 1e-4 * max(1, max|G64|) at every position (G64 computed from
    the same float32 inputs, upcast). Rows include leading zeros, holes and a short row.
    """
    B, T = 3, 8192
    rng = np.random.default_rng(4)
    mask = np.zeros((B, T), dtype=bool)
    mask[0, :] = True
    mask[1, 5:T - 100] = True
    mask[1, 3000:3050] = False
    mask[2, 10:40] = True
    mask = torch.from_numpy(mask)
    R = torch.tensor([1.0, -1.0, 0.5])
    old = torch.tensor(rng.normal(-1.0, 0.5, size=(B, T)), dtype=torch.float32)
    refl = torch.tensor(rng.normal(-1.0, 0.5, size=(B, T)), dtype=torch.float32)
    got = alg.reinforce_plus_plus_returns(R, poison(old, mask, NAN), poison(refl, mask, 1e30),
                                          mask, kl_coef=0.01, gamma=gamma)
    expected = ref.rpp_returns(R, old, refl, mask, kl_coef=0.01, gamma=gamma)
    g = got.double().numpy()
    assert np.all(np.isfinite(g))
    scale = max(1.0, float(np.abs(expected).max()))
    err = float(np.abs(g - expected).max())
    assert err <= 1e-4 * scale, f"gamma={gamma}: max error {err:.3g} > 1e-4 * {scale:.3g}"
    assert_zero_outside(got, mask)


def test_numeric_mask_reads_nonzero():
    rng, R, old, refl, mask = _batch(5, 3, 6, torch.float64)
    numeric = torch.where(mask, torch.tensor(2.5, dtype=torch.float64), torch.tensor(0.0,
                                                                                     dtype=torch.float64))
    numeric[0, mask[0]] = -1.0
    a = alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.05, gamma=0.9)
    b = alg.reinforce_plus_plus_returns(R, old, refl, numeric, kl_coef=0.05, gamma=0.9)
    c = alg.reinforce_plus_plus_returns(R, old, refl, mask.to(torch.int64), kl_coef=0.05,
                                        gamma=0.9)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(a, c, rtol=0, atol=0)


@pytest.mark.parametrize("gamma", [0.0, -0.1, 1.5, float("nan")])
def test_gamma_outside_range_rejected(gamma):
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="gamma"):
        alg.reinforce_plus_plus_returns(torch.zeros(2), z, z, torch.ones(2, 3, dtype=torch.bool),
                                        kl_coef=0.0, gamma=gamma)


def test_shape_mismatches_name_the_argument():
    m = torch.ones(2, 3, dtype=torch.bool)
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="rewards"):
        alg.reinforce_plus_plus_returns(torch.zeros(3), z, z, m, kl_coef=0.01)
    with pytest.raises(ValueError, match="old_log_probs"):
        alg.reinforce_plus_plus_returns(torch.zeros(2), torch.zeros(2, 4), z, m, kl_coef=0.01)
    with pytest.raises(ValueError, match="ref_log_probs"):
        alg.reinforce_plus_plus_returns(torch.zeros(2), z, torch.zeros(3, 3), m, kl_coef=0.01)
    with pytest.raises(ValueError, match="mask"):
        alg.reinforce_plus_plus_returns(torch.zeros(2), z, z, torch.ones(2, 3, 1, dtype=torch.bool),
                                        kl_coef=0.01)
