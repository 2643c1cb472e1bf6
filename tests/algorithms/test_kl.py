"""KL estimators (reinforce_plus_plus.md §2) against the float64 reference."""

import math

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, out_dtype

KINDS = ("k1", "k2", "k3", "low_var_kl")


def test_reference_kl_by_hand():
    # delta = 2: k1 = 2, k2 = 2, k3 = e^-2 + 1; delta = -20: k3 = e^20 - 21 -> clamp 10.
    assert ref.kl_scalar(2.0, "k1") == 2.0
    assert ref.kl_scalar(2.0, "k2") == 2.0
    assert ref.kl_scalar(2.0, "k3") == pytest.approx(math.exp(-2.0) + 1.0)
    assert ref.kl_scalar(-20.0, "low_var_kl") == 10.0
    assert ref.kl_scalar(-20.0, "k3") > 1e8


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_approx_kl_matches_reference(kind, dtype):
    rng = np.random.default_rng(0)
    logp = rng.normal(-2.0, 1.5, size=(4, 7))
    base = rng.normal(-2.0, 1.5, size=(4, 7))
    # Force both clamp regimes of low_var_kl and a delta of exactly zero.
    logp[0, 0], base[0, 0] = -25.0, -1.0   # delta -24: k3 ~ e^24 -> clamped to 10
    logp[0, 1], base[0, 1] = -1.0, -9.0    # delta 8: k3 ~ 7.0003 (inside the clamp)
    logp[0, 2], base[0, 2] = -3.0, -3.0
    a, b = torch.tensor(logp, dtype=dtype), torch.tensor(base, dtype=dtype)
    got = alg.approx_kl(a, b, kind)
    assert got.dtype == out_dtype(dtype)
    expected = ref.approx_kl(a, b, kind)
    if kind == "k3":
        # k3 at delta -24 is ~2.6e10: compare relative to each entry.
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        np.testing.assert_allclose(got.double().numpy(), expected, rtol=tol, atol=tol)
    else:
        assert_ref(got, expected, dtype, what=kind)
    if kind == "low_var_kl":
        assert float(got[0, 0]) == pytest.approx(10.0)
        assert float(got.max()) <= 10.0 and float(got.min()) >= -10.0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_approx_kl_low_precision_inputs_give_float32(dtype):
    a = torch.tensor([[-1.0, -2.0, -0.5]], dtype=dtype)
    b = torch.tensor([[-1.5, -1.0, -0.5]], dtype=dtype)
    got = alg.approx_kl(a, b, "k2")
    assert got.dtype == torch.float32
    assert_ref(got, ref.approx_kl(a, b, "k2"), torch.float32, what="k2 low precision")


def test_approx_kl_unknown_kind_names_it():
    a = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="k7"):
        alg.approx_kl(a, a, "k7")


def test_approx_kl_shape_mismatch():
    with pytest.raises(ValueError):
        alg.approx_kl(torch.zeros(2, 3), torch.zeros(2, 4), "k1")
