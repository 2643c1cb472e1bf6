"""reinforce_plus_plus.md §7a against the float64 reference: the mismatch measures, the
truncated importance weights and the off-policy sequence mask; NaN-safe outside the mask."""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside, poison, random_mask

DTYPES = [torch.float64, torch.float32]


def _data(seed: int, dtype, B=6, T=9):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=(2,))
    q = torch.as_tensor(rng.normal(-2.0, 1.0, (B, T)), dtype=dtype)
    s = q + torch.as_tensor(rng.normal(0.0, 0.6, (B, T)), dtype=dtype)  # ratios beyond [0.5, 2]
    a = torch.as_tensor(rng.normal(0.0, 1.0, (B, T)), dtype=dtype)
    # NaN and Inf outside the mask must not reach any result
    return poison(q, mask, rng=rng), poison(s, mask, rng=rng), poison(a, mask, rng=rng), mask


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mismatch_sums_equal_the_reference(seed, dtype):
    q, s, _, mask = _data(seed, dtype)
    got = alg.mismatch_sums(q, s, mask)
    want = ref.mismatch(q, s, mask)
    assert want["outside"] > 0 and want["tokens"] > 0  # the band is crossed: the test can fail
    for key, value in want.items():
        assert_ref(got[key].reshape(()), value, dtype, what=key)


def test_mismatch_without_tokens_is_zero():
    q = torch.full((2, 3), float("nan"))
    got = alg.mismatch_sums(q, q, torch.zeros(2, 3, dtype=torch.bool))
    assert all(float(v) == 0.0 for v in got.values())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip,clip_low", [(2.0, 0.0), (1.5, 0.5), (1.0, 1.0)])
def test_tis_weights_equal_the_reference(clip, clip_low, dtype):
    q, s, _, mask = _data(3, dtype)
    w, clipped = alg.tis_weights(q, s, mask, clip=clip, clip_low=clip_low)
    want_w, want_clipped = ref.tis(q, s, mask, clip=clip, clip_low=clip_low)
    assert_ref(w, want_w, dtype, what="w")
    assert want_clipped.any() and torch.equal(clipped, torch.from_numpy(want_clipped))
    assert_zero_outside(w, mask, "w")
    assert_zero_outside(clipped, mask, "clipped")
    assert not w.requires_grad


def test_tis_weights_carry_no_gradient():
    q, s, _, mask = _data(4, torch.float64)
    q = q.clone().requires_grad_()
    w, _ = alg.tis_weights(q, s, mask, clip=2.0)
    assert not w.requires_grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("delta", [1e-4, 0.3])
def test_opsm_keep_equals_the_reference(delta, dtype):
    lp, s, a, mask = _data(5, dtype, B=12)
    got = alg.opsm_keep(lp, s, a, mask, delta=delta)
    want = ref.opsm(lp, s, a, mask, delta=delta)
    assert torch.equal(got, torch.from_numpy(want))
    assert got[2]  # a response without tokens is kept
    if delta == 1e-4:
        assert (~got).any() and got.sum() > 1  # some kept, some dropped: the test can fail
