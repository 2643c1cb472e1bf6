"""Masked population normalization (reinforce_plus_plus.md §6) and masked_whiten (§5), single
process."""

import math

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


def _batch(seed, B, T, dtype, masked_rows=(), loc=0.3, scale=2.0):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    values = torch.tensor(rng.normal(loc, scale, size=(B, T)), dtype=dtype)
    return rng, values, mask


def check_stats(stats, expected: ref.RefStats, dtype):
    """Every stats field is a 0-d tensor with the §13 dtype and the reference value."""
    for name in ("mean", "var", "normalized_mean", "normalized_std"):
        v = getattr(stats, name)
        assert isinstance(v, torch.Tensor) and v.dim() == 0, name
        assert v.dtype == torch.float64, f"{name} dtype {v.dtype}"
    assert stats.count.dtype == torch.int64 and stats.count.dim() == 0
    assert stats.zero_variance.dtype == torch.bool and stats.zero_variance.dim() == 0
    assert int(stats.count) == expected.count
    assert bool(stats.zero_variance) == expected.zero_variance
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    scale = max(1.0, abs(expected.mean))
    assert abs(float(stats.mean) - expected.mean) <= tol * scale
    assert abs(float(stats.var) - expected.var) <= tol * max(1.0, expected.var)
    assert abs(float(stats.normalized_mean) - expected.normalized_mean) <= 1e-5
    assert abs(float(stats.normalized_std) - expected.normalized_std) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_matches_reference_with_sentinels(dtype):
    rng, values, mask = _batch(0, 6, 11, dtype, masked_rows=(2,))
    got, stats = alg.masked_population_normalize(poison(values, mask, rng=rng), mask)
    assert got.dtype == out_dtype(dtype)
    (expected,), rstats = ref.population_normalize([values], [mask])
    assert_ref(got, expected, dtype)
    assert_zero_outside(got, mask)
    check_stats(stats, rstats, dtype)
    assert abs(float(stats.normalized_mean)) < 1e-6
    assert float(stats.normalized_std) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("sentinel", SENTINELS)
def test_each_sentinel_equals_clean(sentinel):
    _, values, mask = _batch(1, 4, 9, torch.float32, masked_rows=(1,))
    clean, s1 = alg.masked_population_normalize(values.masked_fill(~mask, 0.0), mask)
    dirty, s2 = alg.masked_population_normalize(poison(values, mask, sentinel), mask)
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    assert float(s1.mean) == float(s2.mean) and float(s1.var) == float(s2.var)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("half_width, expected_abs", [
    # var = 2.5e-9 < floor: floor -> 5e-5 / 1e-4 = 0.5. sqrt(var)+eps -> ~1.0;
    # sqrt(var+eps) -> 0.447.
    (5e-5, 0.5),
    # var = 4e-8 > floor: rsqrt(var) -> 1.0. sqrt(var+eps) -> 0.894.
    (2e-4, 1.0),
])
def test_variance_floor_is_a_floor(dtype, half_width, expected_abs):
    values = torch.tensor([[half_width, -half_width, half_width, -half_width, 99.0]], dtype=dtype)
    mask = torch.tensor([[True, True, True, True, False]])
    got, stats = alg.masked_population_normalize(values, mask)
    np.testing.assert_allclose(got[0, :4].double().numpy(),
                               [expected_abs, -expected_abs, expected_abs, -expected_abs],
                               rtol=1e-5 if dtype == torch.float32 else 1e-10)
    assert bool(stats.zero_variance) == (half_width**2 < 1e-8)
    assert float(got[0, 4]) == 0.0


def test_custom_var_floor():
    values = torch.tensor([[0.1, -0.1]], dtype=torch.float64)  # var = 0.01
    got, stats = alg.masked_population_normalize(values, torch.ones(1, 2, dtype=torch.bool),
                                                 var_floor=0.04)
    assert_ref(got, [[0.5, -0.5]], torch.float64)
    assert bool(stats.zero_variance)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("const", [0.7, -1234.5, 0.0])
def test_zero_variance_gives_finite_zeros(dtype, const):
    _, _, mask = _batch(2, 5, 7, dtype)
    values = poison(torch.full((5, 7), const, dtype=dtype), mask, rng=np.random.default_rng(0))
    got, stats = alg.masked_population_normalize(values, mask)
    assert bool(torch.isfinite(got).all())
    assert float(got.abs().max()) <= 1e-6
    assert bool(stats.zero_variance)
    assert float(stats.mean) == pytest.approx(const)
    assert float(stats.normalized_std) <= 1e-6


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_single_valid_token(dtype):
    values = torch.tensor([[float("nan"), 3.5, float("inf")], [1e30, 0.0, 0.0]], dtype=dtype)
    mask = torch.tensor([[False, True, False], [False, False, False]])
    got, stats = alg.masked_population_normalize(values, mask)
    assert bool(torch.isfinite(got).all()) and float(got.abs().max()) <= 1e-6
    assert int(stats.count) == 1 and bool(stats.zero_variance)
    assert float(stats.mean) == 3.5 and float(stats.var) == 0.0


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_empty_mask_raises(mask_dtype):
    values = torch.randn(3, 4)
    with pytest.raises(RuntimeError):
        alg.masked_population_normalize(values, torch.zeros(3, 4, dtype=mask_dtype))


def test_numeric_mask_reads_nonzero():
    _, values, mask = _batch(3, 4, 6, torch.float64)
    numeric = mask.to(torch.float64) * torch.tensor([1.0, -2.0, 0.5, 7.0])[:, None]
    a, _ = alg.masked_population_normalize(values, mask)
    b, _ = alg.masked_population_normalize(values, numeric)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_token_weighting_longer_rows_weigh_more():
    # §4, §6: moments are over tokens, so a 3-token row weighs 3x a 1-token row.
    values = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    _, stats = alg.masked_population_normalize(values, mask)
    assert float(stats.mean) == pytest.approx(0.75)
    assert float(stats.var) == pytest.approx(0.1875)


def test_shape_mismatch_names_argument():
    with pytest.raises(ValueError, match="mask|values"):
        alg.masked_population_normalize(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))


# ------------------------------------------------------------------- masked_whiten


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_whiten_matches_reference(dtype):
    rng, values, mask = _batch(4, 5, 8, dtype, masked_rows=(0,))
    got = alg.masked_whiten(poison(values, mask, rng=rng), mask)
    assert got.dtype == out_dtype(dtype)
    assert_ref(got, ref.whiten([values], [mask])[0], dtype)
    assert_zero_outside(got, mask)


def test_whiten_is_bessel_corrected():
    values = torch.tensor([[1.0, 3.0]], dtype=torch.float64)  # ddof=1 var 2, ddof=0 var 1
    got = alg.masked_whiten(values, torch.ones(1, 2, dtype=torch.bool))
    s = 1.0 / math.sqrt(2.0 + 1e-8)
    assert_ref(got, [[-s, s]], torch.float64)


def test_whiten_single_token_variance_zero():
    values = torch.tensor([[float("nan"), 2.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[False, True, False]])
    got = alg.masked_whiten(values, mask)
    assert bool(torch.isfinite(got).all()) and float(got.abs().max()) == 0.0


def test_whiten_custom_eps():
    values = torch.tensor([[1.0, 3.0]], dtype=torch.float64)
    got = alg.masked_whiten(values, torch.ones(1, 2, dtype=torch.bool), eps=2.0)
    assert_ref(got, [[-0.5, 0.5]], torch.float64)


def test_float32_moments_are_accumulated_in_float64():
    """§6: float64 moments. 32k float32 tokens at offset 100 with unit spread: a float32
    E[x^2] - E[x]^2 would be off by ~1e-3; float64 accumulation matches to ~1e-12."""
    rng = np.random.default_rng(9)
    B, T = 64, 512
    mask = random_mask(rng, B, T, masked_rows=(3,))
    values = torch.tensor(100.0 + rng.normal(0.0, 1.0, size=(B, T)), dtype=torch.float32)
    got, stats = alg.masked_population_normalize(poison(values, mask, rng=rng), mask)
    (expected,), rstats = ref.population_normalize([values], [mask])
    assert float(stats.mean) == pytest.approx(rstats.mean, rel=1e-12)
    assert float(stats.var) == pytest.approx(rstats.var, rel=1e-9)
    # float32 output: |x - mu| is rounded at ulp(100)/2 ~ 4e-6, i.e. ~4e-6 in the output.
    assert_ref(got, expected, torch.float32)
