"""Property tests (hypothesis) over random shapes, masks with holes, fully masked rows and
NaN/Inf/huge sentinels outside the mask; every production output is compared with the
float64 reference on the clean values.
"""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import SENTINELS, assert_ref, assert_zero_outside, safe_flags

DTYPES = (torch.float64, torch.float32)


@st.composite
def batches(draw, min_valid=0):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 12))
    rows = draw(st.lists(st.lists(st.booleans(), min_size=T, max_size=T), min_size=B,
                         max_size=B))
    mask = np.array(rows, dtype=bool)
    if mask.sum() < min_valid:
        mask[draw(st.integers(0, B - 1)), draw(st.integers(0, T - 1))] = True
    seed = draw(st.integers(0, 2**32 - 1))
    sentinel = draw(st.sampled_from(SENTINELS + (None,)))  # None: a mix of all of them
    dtype = draw(st.sampled_from(DTYPES))
    rng = np.random.default_rng(seed)
    n_groups = draw(st.integers(1, B))
    return dict(B=B, T=T, mask=torch.from_numpy(mask), rng=rng, sentinel=sentinel, dtype=dtype,
                group_index=torch.from_numpy(rng.integers(0, n_groups, size=B)).long())


def _values(b, loc=0.0, scale=1.0):
    return torch.tensor(b["rng"].normal(loc, scale, size=(b["B"], b["T"])), dtype=b["dtype"])


def _dirty(b, x):
    x = x.detach().clone()
    bad = ~b["mask"]
    if b["sentinel"] is not None:
        x[bad] = b["sentinel"]
    else:
        n = int(bad.sum())
        x[bad] = torch.tensor([SENTINELS[k % len(SENTINELS)] for k in range(n)],
                              dtype=torch.float64).to(x.dtype)
    return x


@given(batches(), st.sampled_from([1.0, 0.99, 0.9, 0.5]), st.sampled_from([0.0, 0.01, 0.3]))
def test_returns_property(b, gamma, beta):
    R = torch.tensor(b["rng"].normal(size=b["B"]), dtype=b["dtype"])
    old, refl = _values(b, -1.0), _values(b, -1.0)
    got = alg.reinforce_plus_plus_returns(R, _dirty(b, old), _dirty(b, refl), b["mask"],
                                          kl_coef=beta, gamma=gamma)
    assert_ref(got, ref.rpp_returns(R, old, refl, b["mask"], kl_coef=beta, gamma=gamma),
               b["dtype"])
    assert_zero_outside(got, b["mask"])


@given(batches())
def test_group_advantages_property(b):
    R = torch.tensor(b["rng"].choice([0.0, 1.0, 0.5], size=b["B"]), dtype=b["dtype"])
    gi, m = b["group_index"], b["mask"]
    got = alg.reinforce_plus_plus_baseline_advantages(R, gi, m)
    assert_ref(got, ref.baseline_advantages(R, gi, m), b["dtype"])
    assert_zero_outside(got, m)
    for std in (True, False):
        got = alg.group_relative_advantages(R, gi, m, std_normalization=std)
        expected = ref.group_relative_advantages(R, gi, m, std_normalization=std)
        # A/(std + 1e-6) can reach ~1e6 when the std is tiny: compare relative to the scale.
        assert_ref(got, expected, b["dtype"])
        assert_zero_outside(got, m)


@given(batches())
def test_normalize_property(b):
    values = _values(b, 0.2, 1.3)
    m = b["mask"]
    if not bool(m.any()):
        with pytest.raises(RuntimeError):
            alg.masked_population_normalize(_dirty(b, values), m)
        return
    got, stats = alg.masked_population_normalize(_dirty(b, values), m)
    (expected,), rstats = ref.population_normalize([values], [m])
    assert_ref(got, expected, b["dtype"])
    assert_zero_outside(got, m)
    assert int(stats.count) == rstats.count
    assert bool(stats.zero_variance) == rstats.zero_variance
    assert float(stats.mean) == pytest.approx(rstats.mean, rel=1e-9, abs=1e-9)
    whitened = alg.masked_whiten(_dirty(b, values), m)
    assert_ref(whitened, ref.whiten([values], [m])[0], b["dtype"])
    assert_zero_outside(whitened, m)


@pytest.mark.parametrize("kind", ["ppo", "ppo_dual", "gspo", "sapo", "cispo", "rloo"])
@given(b=batches())
def test_losses_property(kind, b):
    old = _values(b, -1.5, 0.5)
    lp = (old.double() + torch.tensor(b["rng"].normal(0, 0.4, size=old.shape))).to(b["dtype"])
    A = _values(b)
    m = b["mask"]
    dl, do, dA = _dirty(b, lp), _dirty(b, old), _dirty(b, A)
    leaf = dl.clone().requires_grad_(True)
    eps_lo, eps_hi = 0.2, 0.28
    if kind == "ppo":
        pg, clipped = alg.ppo_clip_loss(leaf, do, dA, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rpg, rflags = ref.ppo_clip_loss(lp, old, A, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rho = np.exp(lp.double().numpy() - old.double().numpy())
    elif kind == "ppo_dual":
        eps_hi = eps_lo
        pg, clipped = alg.ppo_clip_loss(leaf, do, dA, m, eps_clip=eps_lo, eps_clip_c=1.3)
        rpg, rflags = ref.ppo_clip_loss(lp, old, A, m, eps_clip=eps_lo, eps_clip_c=1.3)
        rho = np.exp(lp.double().numpy() - old.double().numpy())
    elif kind == "gspo":
        pg, clipped = alg.gspo_loss(leaf, do, dA, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rpg, rflags = ref.gspo_loss(lp, old, A, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rho = ref.gspo_ratios(lp, old, m)[:, None] * np.ones(m.shape)
    elif kind == "cispo":
        pg, clipped = alg.cispo_loss(leaf, do, dA, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rpg, _, rflags = ref.cispo_loss(lp, old, A, m, eps_clip=eps_lo, eps_clip_high=eps_hi)
        rho = np.exp(lp.double().numpy() - old.double().numpy())
    elif kind == "rloo":
        pg = alg.rloo_loss(leaf, dA, m)
        clipped, rpg, rflags, rho = None, ref.rloo_loss(lp, A, m), None, None
    else:
        pg = alg.sapo_loss(leaf, do, dA, m)
        clipped, rpg, rflags, rho = None, ref.sapo_loss(lp, old, A, m), None, None
    assert_ref(pg, rpg, b["dtype"])
    assert_zero_outside(pg, m)
    if clipped is not None:
        safe = safe_flags(rho, eps_lo, eps_hi) & m.numpy()
        if kind == "ppo_dual":  # dual-clip activity is not part of the clip-fraction contract
            r = np.exp(lp.double().numpy() - old.double().numpy())
            safe &= ~((A.double().numpy() < 0) & (r > 1.3 - 1e-3))
        assert np.array_equal(clipped.numpy()[safe], rflags[safe])
        assert_zero_outside(clipped, m)
    loss = alg.response_mean(pg, m)
    assert float(loss.detach()) == pytest.approx(ref.response_mean(rpg, m),
                                        rel=1e-5, abs=1e-6)
    (g,) = torch.autograd.grad(loss, leaf)
    assert bool(torch.isfinite(g).all())
    assert_zero_outside(g, m)
    tm = alg.token_mean(pg, m)
    if bool(m.any()):
        assert float(tm.detach()) == pytest.approx(ref.token_mean(rpg, m), rel=1e-5, abs=1e-6)


@given(batches(), st.integers(1, 5))
def test_micro_batch_split_property(b, n_split):
    """Summing response_mean(..., num_responses=B) over any row split equals the whole batch."""
    B, m = b["B"], b["mask"]
    old = _values(b, -1.0, 0.5)
    lp = _dirty(b, old + 0.3 * _values(b))
    A, old = _dirty(b, _values(b)), _dirty(b, old)
    cuts = sorted(set(b["rng"].integers(1, B + 1, size=n_split).tolist()) | {B})
    leaf_w = lp.clone().requires_grad_(True)
    whole = alg.response_mean(alg.ppo_clip_loss(leaf_w, old, A, m)[0], m)
    whole.backward()
    leaf = lp.clone().requires_grad_(True)
    total, start = 0.0, 0
    for stop in cuts:
        sl = slice(start, stop)
        part = alg.response_mean(alg.ppo_clip_loss(leaf[sl], old[sl], A[sl], m[sl])[0], m[sl],
                                 num_responses=B)
        part.backward()
        total += float(part.detach())
        start = stop
    tol = 1e-12 if b["dtype"] == torch.float64 else 1e-5
    assert total == pytest.approx(float(whole.detach()), rel=tol, abs=tol)
    torch.testing.assert_close(leaf.grad, leaf_w.grad, rtol=tol, atol=tol)
