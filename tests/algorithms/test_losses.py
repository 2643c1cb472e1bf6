"""Policy losses and reductions (reinforce_plus_plus.md §7, §13) against the float64 reference."""

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
    safe_flags,
)

LOG = math.log


def _batch(seed, B, T, dtype, masked_rows=(), spread=0.4):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    old = rng.normal(-1.5, 0.7, size=(B, T))
    lp = old + rng.normal(0.0, spread, size=(B, T))  # ratios spread across both clip bounds
    adv = rng.normal(0.0, 1.0, size=(B, T))
    return (rng, torch.tensor(lp, dtype=dtype), torch.tensor(old, dtype=dtype),
            torch.tensor(adv, dtype=dtype), mask)


# --------------------------------------------------------------------------- PPO clip


def test_ppo_by_hand():
    # rho, A -> pg, clipped (eps 0.2):
    #  1.5, +1 -> max(-1.5, -1.2) = -1.2  clipped
    #  0.5, +1 -> max(-0.5, -0.8) = -0.5  not clipped
    #  0.5, -1 -> max( 0.5,  0.8) =  0.8  clipped
    #  1.5, -1 -> max( 1.5,  1.2) =  1.5  not clipped
    #  1.1, +2 -> -2.2 (inside the range) not clipped
    rho = [1.5, 0.5, 0.5, 1.5, 1.1]
    A = [1.0, 1.0, -1.0, -1.0, 2.0]
    lp = torch.tensor([[LOG(r) for r in rho]], dtype=torch.float64)
    old = torch.zeros(1, 5, dtype=torch.float64)
    mask = torch.ones(1, 5, dtype=torch.bool)
    pg, clipped = alg.ppo_clip_loss(lp, old, torch.tensor([A], dtype=torch.float64), mask)
    assert_ref(pg, [[-1.2, -0.5, 0.8, 1.5, -2.2]], torch.float64)
    assert clipped.dtype == torch.bool
    assert clipped.tolist() == [[True, False, True, False, False]]
    rpg, rflags = ref.ppo_clip_loss(lp, old, [A], mask)
    np.testing.assert_allclose(rpg, [[-1.2, -0.5, 0.8, 1.5, -2.2]], atol=1e-12)
    assert rflags.tolist() == clipped.tolist()


def test_ppo_asymmetric_clip_high():
    lp = torch.tensor([[LOG(1.5), LOG(0.5)]], dtype=torch.float64)
    old = torch.zeros(1, 2, dtype=torch.float64)
    A = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    pg, clipped = alg.ppo_clip_loss(lp, old, A, torch.ones(1, 2, dtype=torch.bool),
                                    eps_clip=0.2, eps_clip_high=0.28)
    assert_ref(pg, [[-1.28, 0.8]], torch.float64)
    assert clipped.tolist() == [[True, True]]


def test_ppo_dual_clip():
    # A < 0 with a huge ratio: pg = min(max(5, 1.2), 3) = 3. A > 0 is untouched.
    lp = torch.tensor([[LOG(5.0), LOG(5.0), LOG(2.0), LOG(0.5)]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    A = torch.tensor([[-1.0, 1.0, -1.0, -2.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.bool)
    pg, clipped = alg.ppo_clip_loss(lp, old, A, mask, eps_clip_c=3.0)
    assert_ref(pg, [[3.0, -1.2, 2.0, 1.6]], torch.float64)
    assert clipped[0, 1:].tolist() == [True, False, True]
    rpg, _ = ref.ppo_clip_loss(lp, old, A, mask, eps_clip_c=3.0)
    np.testing.assert_allclose(rpg, [[3.0, -1.2, 2.0, 1.6]], atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("kw", [{}, dict(eps_clip=0.1, eps_clip_high=0.3),
                                dict(eps_clip=0.2, eps_clip_c=3.0)])
def test_ppo_matches_reference(dtype, kw):
    rng, lp, old, A, mask = _batch(0, 6, 10, dtype, masked_rows=(2,), spread=0.8)
    pg, clipped = alg.ppo_clip_loss(poison(lp, mask, rng=rng), poison(old, mask, rng=rng),
                                    poison(A, mask, rng=rng), mask, **kw)
    assert pg.dtype == out_dtype(dtype)
    rpg, rflags = ref.ppo_clip_loss(lp, old, A, mask, **kw)
    assert_ref(pg, rpg, dtype)
    assert_zero_outside(pg, mask)
    assert_zero_outside(clipped, mask)
    rho = np.exp(lp.double().numpy() - old.double().numpy())
    eps = kw.get("eps_clip", 0.2)
    safe = safe_flags(rho, eps, kw.get("eps_clip_high") or eps) & mask.numpy()
    if kw.get("eps_clip_c"):
        safe &= ~((A.double().numpy() < 0) & (rho > kw["eps_clip_c"]))  # dual-clip region
    assert np.array_equal(clipped.numpy()[safe], rflags[safe])
    assert rflags[safe].any() and (~rflags[safe]).any()  # both branches exercised


# ------------------------------------------------------------------------------- GSPO


def test_gspo_uses_sequence_ratio():
    # Row 0: log-ratios [ln 2, 0, *hole*, 0] -> s = exp(ln2 / 3) = 2^(1/3) ~ 1.26 on all tokens.
    lp = torch.tensor([[LOG(2.0), 0.0, float("nan"), 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    mask = torch.tensor([[True, True, False, True]])
    A = torch.tensor([[1.0, -1.0, 5.0, 0.5]], dtype=torch.float64)
    pg, clipped = alg.gspo_loss(lp, old, A, mask, eps_clip=0.2)
    s = 2.0 ** (1.0 / 3.0)
    assert_ref(pg, [[-1.2, s, 0.0, -0.6]], torch.float64)
    assert clipped.tolist() == [[True, False, False, True]]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gspo_matches_reference(dtype):
    rng, lp, old, A, mask = _batch(1, 6, 9, dtype, masked_rows=(4,), spread=0.5)
    pg, clipped = alg.gspo_loss(poison(lp, mask, rng=rng), poison(old, mask, rng=rng),
                                poison(A, mask, rng=rng), mask, eps_clip=0.2,
                                eps_clip_high=0.25)
    assert pg.dtype == out_dtype(dtype)
    rpg, rflags = ref.gspo_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.25)
    assert_ref(pg, rpg, dtype)
    assert_zero_outside(pg, mask)
    assert_zero_outside(clipped, mask)
    s = ref.gspo_ratios(lp, old, mask)[:, None] * np.ones(mask.shape)
    safe = safe_flags(s, 0.2, 0.25) & mask.numpy()
    assert np.array_equal(clipped.numpy()[safe], rflags[safe])


# ------------------------------------------------------------------------------- SAPO


def test_sapo_by_hand():
    # tau by the sign of A: A > 0 -> tau_pos = 1, else tau_neg = 1.05.
    lp = torch.tensor([[LOG(1.5), LOG(1.5), LOG(0.5), 0.0]], dtype=torch.float64)
    old = torch.zeros(1, 4, dtype=torch.float64)
    A = torch.tensor([[2.0, -2.0, -1.0, 0.0]], dtype=torch.float64)
    pg = alg.sapo_loss(lp, old, A, torch.ones(1, 4, dtype=torch.bool))

    def f(rho, tau):
        return 4.0 / (1.0 + math.exp(-tau * (rho - 1.0))) / tau

    assert_ref(pg, [[-f(1.5, 1.0) * 2, f(1.5, 1.05) * 2, f(0.5, 1.05), 0.0]], torch.float64)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("taus", [(1.0, 1.05), (0.5, 2.0)])
def test_sapo_matches_reference(dtype, taus):
    rng, lp, old, A, mask = _batch(2, 5, 8, dtype, masked_rows=(1,), spread=1.0)
    pg = alg.sapo_loss(poison(lp, mask, rng=rng), poison(old, mask, rng=rng),
                       poison(A, mask, rng=rng), mask, tau_pos=taus[0], tau_neg=taus[1])
    assert pg.dtype == out_dtype(dtype)
    assert_ref(pg, ref.sapo_loss(lp, old, A, mask, tau_pos=taus[0], tau_neg=taus[1]), dtype)
    assert_zero_outside(pg, mask)


# ------------------------------------------------------------------------- reductions


def test_response_mean_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 6.0], [float("inf"), 0.0, 0.0]],
                     dtype=torch.float64)
    m = torch.tensor([[True, True, True], [True, False, True], [False, False, False]])
    # Row means 2 and 5; the empty row counts in B and adds 0: (2 + 5 + 0) / 3.
    assert float(alg.response_mean(v, m)) == pytest.approx(7.0 / 3.0)
    assert float(alg.response_mean(v, m, num_responses=7)) == pytest.approx(1.0)
    assert float(alg.token_mean(v, m)) == pytest.approx(16.0 / 5.0)
    assert float(alg.token_mean(v, m, num_tokens=8)) == pytest.approx(2.0)
    assert ref.response_mean(v, m) == pytest.approx(7.0 / 3.0)
    assert ref.token_mean(v, m) == pytest.approx(16.0 / 5.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_reductions_match_reference(dtype):
    rng, lp, _, _, mask = _batch(3, 6, 7, dtype, masked_rows=(0, 5))
    v = poison(lp, mask, rng=rng)
    for got, expected in [
        (alg.response_mean(v, mask), ref.response_mean(lp, mask)),
        (alg.response_mean(v, mask, num_responses=20), ref.response_mean(lp, mask, num_responses=20)),
        (alg.token_mean(v, mask), ref.token_mean(lp, mask)),
        (alg.token_mean(v, mask, num_tokens=50), ref.token_mean(lp, mask, num_tokens=50)),
    ]:
        assert got.dim() == 0 and got.dtype == out_dtype(dtype)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        assert abs(float(got) - expected) <= tol * max(1.0, abs(expected)), (float(got), expected)


def test_k2_loss_response_reduced():
    # §4, §7: D_k2 = 0.5 (logp - logp_ref)^2, reduced like the policy loss.
    rng, lp, _, _, mask = _batch(4, 4, 6, torch.float64, masked_rows=(3,))
    refl = lp + torch.tensor(rng.normal(0, 0.3, size=lp.shape))
    k2 = alg.approx_kl(lp, refl, "k2")
    got = alg.response_mean(k2, mask)
    expected = ref.response_mean(ref.approx_kl(lp, refl, "k2"), mask)
    assert float(got) == pytest.approx(expected, rel=1e-12)


# -------------------------------------------------- gradients and masked sentinels


LOSSES = ["ppo", "ppo_dual", "gspo", "sapo", "cispo", "rloo"]


def _loss_tokens(kind, lp, old, A, mask):
    if kind == "ppo":
        return alg.ppo_clip_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.28)[0]
    if kind == "ppo_dual":
        return alg.ppo_clip_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_c=3.0)[0]
    if kind == "gspo":
        return alg.gspo_loss(lp, old, A, mask, eps_clip=0.2)[0]
    if kind == "cispo":
        return alg.cispo_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.28)[0]
    if kind == "rloo":
        return alg.rloo_loss(lp, A, mask)
    return alg.sapo_loss(lp, old, A, mask)


def _ref_objective(kind, lp, old, A, mask, at=None):
    """The float64 objective; ``at``: where CISPO's detached weight is read (default ``lp``),
    so finite differences see ``-w A logp`` with ``w`` a constant (§5b)."""
    if kind == "cispo":
        w = ref.cispo_loss(lp if at is None else at, old, A, mask, eps_clip=0.2,
                           eps_clip_high=0.28)[1]
        pg = np.where(ref.as_mask(mask), -w * ref.f64(A) * ref.f64(lp), 0.0)
    elif kind == "rloo":
        pg = ref.rloo_loss(lp, A, mask)
    elif kind == "ppo":
        pg = ref.ppo_clip_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.28)[0]
    elif kind == "ppo_dual":
        pg = ref.ppo_clip_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_c=3.0)[0]
    elif kind == "gspo":
        pg = ref.gspo_loss(lp, old, A, mask, eps_clip=0.2)[0]
    else:
        pg = ref.sapo_loss(lp, old, A, mask)
    return ref.response_mean(pg, mask)


def _grad(kind, lp, old, A, mask, num_responses=None):
    lp = lp.detach().clone().requires_grad_(True)
    loss = alg.response_mean(_loss_tokens(kind, lp, old, A, mask), mask,
                             num_responses=num_responses)
    (g,) = torch.autograd.grad(loss, lp)
    return loss.detach(), g


@pytest.mark.parametrize("kind", LOSSES)
def test_gradient_matches_reference_finite_differences(kind):
    rng, lp, old, A, mask = _batch(5, 3, 5, torch.float64, masked_rows=(1,), spread=0.6)
    if kind == "ppo_dual":
        A = -A.abs()
        lp = torch.where(torch.arange(5) == 0, old + LOG(4.0), lp)  # some tokens past c = 3
    loss, g = _grad(kind, lp, old, A, mask)
    assert float(loss) == pytest.approx(_ref_objective(kind, lp, old, A, mask), rel=1e-10)
    h = 1e-6
    fd = np.zeros(lp.shape)
    base = lp.double().numpy()
    for idx in np.ndindex(lp.shape):
        if not mask[idx]:
            continue
        up, dn = base.copy(), base.copy()
        up[idx] += h
        dn[idx] -= h
        fd[idx] = (_ref_objective(kind, up, old, A, mask, at=base)
                   - _ref_objective(kind, dn, old, A, mask, at=base)) / (2 * h)
    np.testing.assert_allclose(g.numpy(), fd, rtol=1e-5, atol=1e-7)
    assert_zero_outside(g, mask)


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("sentinel", SENTINELS)
def test_masked_sentinels_leave_values_and_gradients_clean(kind, sentinel):
    rng, lp, old, A, mask = _batch(6, 5, 7, torch.float32, masked_rows=(2,))
    clean = [x.masked_fill(~mask, 0.0) for x in (lp, old, A)]
    loss_c, g_c = _grad(kind, *clean, mask)
    dirty = [poison(x, mask, sentinel) for x in (lp, old, A)]
    loss_d, g_d = _grad(kind, *dirty, mask)
    assert bool(torch.isfinite(loss_d)) and bool(torch.isfinite(g_d).all())
    torch.testing.assert_close(loss_d, loss_c, rtol=0, atol=0)
    torch.testing.assert_close(g_d, g_c, rtol=0, atol=0)
    assert_zero_outside(g_d, mask)
    tokens = _loss_tokens(kind, *dirty, mask)
    torch.testing.assert_close(tokens, _loss_tokens(kind, *clean, mask), rtol=0, atol=0)


@pytest.mark.parametrize("kind", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_micro_batch_additivity(kind, dtype):
    B = 7
    rng, lp, old, A, mask = _batch(7, B, 6, dtype, masked_rows=(3,))
    lp, old, A = (poison(x, mask, rng=rng) for x in (lp, old, A))
    whole_loss, whole_grad = _grad(kind, lp, old, A, mask)
    leaf = lp.detach().clone().requires_grad_(True)
    total = 0.0
    for chunk in ([0, 1, 2], [3], [4, 5, 6]):
        idx = torch.tensor(chunk)
        part = alg.response_mean(_loss_tokens(kind, leaf[idx], old[idx], A[idx], mask[idx]),
                                 mask[idx], num_responses=B)
        part.backward()
        total = total + part.detach()
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, whole_loss, **tol)
    torch.testing.assert_close(leaf.grad, whole_grad, **tol)
    assert bool(torch.isfinite(leaf.grad).all())


# ------------------------------------------------------------- registry and dispatch

EXPECTED_LOSS = {"reinforce_plus_plus": "ppo_clip", "reinforce_plus_plus_baseline": "ppo_clip",
                 "grpo": "ppo_clip", "gspo": "gspo", "sapo": "sapo", "cispo": "cispo",
                 "rloo": "rloo", "ppo": "ppo_clip"}


def test_estimator_table():
    assert set(alg.ESTIMATORS) == set(EXPECTED_LOSS)
    for name, loss in EXPECTED_LOSS.items():
        assert alg.ESTIMATORS[name].facts.policy_loss == loss
        assert alg.get_estimator(name).facts.policy_loss == loss


def test_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as err:
        alg.get_estimator("ppo_plus")
    msg = str(err.value)
    assert "ppo_plus" in msg and "estimator" in msg
    for name in EXPECTED_LOSS:
        assert name in msg


@pytest.mark.parametrize("estimator", sorted(EXPECTED_LOSS))
def test_compute_policy_loss_dispatch(estimator):
    rng, lp, old, A, mask = _batch(8, 4, 6, torch.float32, masked_rows=(0,), spread=0.6)
    pg, clipped = alg.compute_policy_loss(estimator, lp, old, A, mask, eps_clip=0.2,
                                          eps_clip_high=0.3, sapo_tau_pos=0.9,
                                          sapo_tau_neg=1.1)
    loss = EXPECTED_LOSS[estimator]
    if loss == "ppo_clip":
        rpg, _ = ref.ppo_clip_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.3)
    elif loss == "gspo":
        rpg, _ = ref.gspo_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.3)
    elif loss == "cispo":
        rpg, _, rflags = ref.cispo_loss(lp, old, A, mask, eps_clip=0.2, eps_clip_high=0.3)
        assert clipped.tolist() == rflags.tolist() and bool(clipped.any())
    elif loss == "rloo":
        rpg = ref.rloo_loss(lp, A, mask)
        assert clipped.dtype == torch.bool and not bool(clipped.any())
    else:
        rpg = ref.sapo_loss(lp, old, A, mask, tau_pos=0.9, tau_neg=1.1)
        assert clipped.dtype == torch.bool and not bool(clipped.any())
    assert_ref(pg, rpg, torch.float32)
    assert clipped.shape == mask.shape


@pytest.mark.parametrize("fn", ["ppo_clip_loss", "gspo_loss", "sapo_loss", "cispo_loss"])
def test_loss_shape_mismatch_names_argument(fn):
    f = getattr(alg, fn)
    z, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    kw = {"eps_clip": 0.2} if fn == "gspo_loss" else {}
    with pytest.raises(ValueError, match="old_log_probs"):
        f(z, torch.zeros(2, 4), z, m, **kw)
    with pytest.raises(ValueError, match="advantages"):
        f(z, z, torch.zeros(3, 3), m, **kw)
    with pytest.raises(ValueError, match="log_probs"):
        f(torch.zeros(2, 2), z, z, m, **kw)


def test_reduction_shape_mismatch():
    with pytest.raises(ValueError):
        alg.response_mean(torch.zeros(2, 3), torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError):
        alg.token_mean(torch.zeros(2, 3), torch.ones(3, 3, dtype=torch.bool))
