"""Gradients of the policy losses and reductions into ``log_probs``, against analytic float64
formulas written here from reinforce_plus_plus.md §7 (never the production math): values,
``clipped`` flags and gradients in float32 and float64, NaN/Inf/huge sentinels at masked
positions (§1: they reach no value and no gradient), a second backward through a retained
graph, non-contiguous and low-precision inputs, and the KL estimators' gradients (§2).
"""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import SENTINELS, assert_ref, assert_zero_outside, poison, random_mask

DTYPES = [torch.float64, torch.float32]
CLIPS = [dict(), dict(eps_clip=0.1, eps_clip_high=0.3), dict(eps_clip=0.2, eps_clip_c=3.0)]


def _batch(seed, B, T, dtype, masked_rows=(1,)):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    old = rng.normal(-1.5, 0.7, size=(B, T))
    lp = old + rng.normal(0.0, 0.8, size=(B, T))  # ratios on both sides of both bounds
    adv = rng.normal(0.0, 1.0, size=(B, T))
    adv[:, ::5] = -np.abs(adv[:, ::5]) * 3  # some A < 0 with large ratios: dual clip active
    return rng, *(torch.tensor(x, dtype=dtype) for x in (lp, old, adv)), mask


def _per_response_mean_weights(mask):
    """d response_mean / d values = 1 / (B * L_i) on valid tokens (§7)."""
    m = mask.numpy()
    return np.where(m, 1.0 / (m.shape[0] * np.maximum(m.sum(axis=1, keepdims=True), 1)), 0.0)


def _grad(loss_fn, lp):
    leaf = lp.detach().clone().requires_grad_(True)
    loss = loss_fn(leaf)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


def _np(*xs):
    return [x.detach().double().numpy() for x in xs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", CLIPS)
def test_ppo_values_and_gradient_match_the_analytic_reference(dtype, kw):
    rng, lp, old, adv, mask = _batch(0, 6, 40, dtype)
    pg, clipped = alg.ppo_clip_loss(lp, old, adv, mask, **kw)
    ref_pg, ref_flags = ref.ppo_clip_loss(lp, old, adv, mask, **kw)
    assert_ref(pg, ref_pg, dtype)
    assert clipped.any() and (mask & ~clipped).any()  # both branches exercised
    loss, g = _grad(lambda x: alg.response_mean(alg.ppo_clip_loss(x, old, adv, mask, **kw)[0], mask), lp)
    assert float(loss) == pytest.approx(ref.response_mean(ref_pg, mask),
                                        rel=1e-9 if dtype == torch.float64 else 1e-5)
    # -A*rho on valid tokens the unclipped branch sets, 0 elsewhere, times 1 / (B * L_i).
    lpn, oldn, a = _np(lp, old, adv)
    rho, m = np.exp(lpn - oldn), mask.numpy()
    flags = ref_flags  # the two bounds; the dual clip below
    if "eps_clip_c" in kw:
        c = kw["eps_clip_c"]
        flags = flags | ((a < 0) & (-c * a < np.maximum(-a * rho, -a * np.clip(rho, 0.8, 1.2))))
    assert np.array_equal(clipped.numpy(), flags & m)
    expect = np.where(m & ~flags, -a * rho, 0.0) * _per_response_mean_weights(mask)
    assert_ref(g, expect, dtype, scale=float(np.abs(expect).max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("taus", [dict(), dict(tau_pos=0.7, tau_neg=1.3)])
def test_sapo_values_and_gradient_match_the_analytic_reference(dtype, taus):
    rng, lp, old, adv, mask = _batch(10, 6, 40, dtype)
    assert_ref(alg.sapo_loss(lp, old, adv, mask, **taus), ref.sapo_loss(lp, old, adv, mask, **taus), dtype)
    _, g = _grad(lambda x: alg.response_mean(alg.sapo_loss(x, old, adv, mask, **taus), mask), lp)
    # d/dlp of -4 sigmoid(tau (rho - 1)) A / tau = -4 A s (1 - s) rho (the 1/tau cancels).
    lpn, oldn, a = _np(lp, old, adv)
    rho = np.exp(lpn - oldn)
    tau = np.where(a > 0, taus.get("tau_pos", 1.0), taus.get("tau_neg", 1.05))
    s = 1.0 / (1.0 + np.exp(-tau * (rho - 1.0)))
    expect = np.where(mask.numpy(), -4.0 * a * s * (1.0 - s) * rho, 0.0) * _per_response_mean_weights(mask)
    assert_ref(g, expect, dtype, scale=float(np.abs(expect).max()))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gspo_values_and_gradient_match_the_analytic_reference(dtype):
    rng, lp, old, adv, mask = _batch(11, 8, 30, dtype, masked_rows=(1,))
    lp = lp + torch.tensor(rng.normal(0, 0.4, size=(8, 1)), dtype=dtype)  # rows on both sides of the clip
    kw = dict(eps_clip=0.1, eps_clip_high=0.15)
    pg, clipped = alg.gspo_loss(lp, old, adv, mask, **kw)
    assert_ref(pg, ref.gspo_loss(lp, old, adv, mask, **kw)[0], dtype)
    assert clipped.any() and (mask & ~clipped).any()
    _, g = _grad(lambda x: alg.response_mean(alg.gspo_loss(x, old, adv, mask, **kw)[0], mask), lp)
    # s_i depends on every valid token: d s_i / d lp[i,u] = s_i m[i,u] / L_i, so
    # grad[i,u] = m[i,u] / L_i * sum_t w[i,t] * (-A[i,t] s_i) over valid unclipped t.
    a, m = _np(adv)[0], mask.numpy()
    s = ref.gspo_ratios(lp, old, mask)[:, None]
    L = np.maximum(m.sum(axis=1, keepdims=True), 1)
    unclipped = m & ~clipped.numpy()
    row = (np.where(unclipped, -a * s, 0.0) * _per_response_mean_weights(mask)).sum(axis=1, keepdims=True)
    expect = np.where(m, row / L, 0.0)
    assert_ref(g, expect, dtype, scale=float(np.abs(expect).max()))


LOSSES = {
    "ppo": lambda x, o, a, m: alg.ppo_clip_loss(x, o, a, m, eps_clip_c=3.0)[0],
    "gspo": lambda x, o, a, m: alg.gspo_loss(x, o, a, m, eps_clip=0.2)[0],
    "sapo": lambda x, o, a, m: alg.sapo_loss(x, o, a, m),
    "cispo": lambda x, o, a, m: alg.cispo_loss(x, o, a, m, eps_clip_high=0.28)[0],
    "rloo": lambda x, o, a, m: alg.rloo_loss(x, a, m),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("sentinel", SENTINELS)
def test_masked_sentinels_reach_no_value_and_no_gradient(dtype, loss, sentinel):
    rng, lp, old, adv, mask = _batch(1, 5, 24, dtype, masked_rows=(2,))
    f = LOSSES[loss]
    dirty = [poison(x, mask, sentinel) for x in (lp, old, adv)]
    clean = [x.masked_fill(~mask, 0.0) for x in (lp, old, adv)]
    assert torch.equal(f(*dirty, mask), f(*clean, mask))
    loss_d, g_d = _grad(lambda x: alg.response_mean(f(x, *dirty[1:], mask), mask), dirty[0])
    _, g_c = _grad(lambda x: alg.response_mean(f(x, *clean[1:], mask), mask), clean[0])
    assert bool(torch.isfinite(loss_d)) and bool(torch.isfinite(g_d).all())
    assert torch.equal(g_d, g_c)
    assert_zero_outside(g_d, mask)


@pytest.mark.parametrize("kind", ["k1", "k2", "k3", "low_var_kl"])
@pytest.mark.parametrize("sentinel", SENTINELS)
def test_kl_gradients_are_finite_and_zero_at_masked_positions(kind, sentinel):
    # §1/§2: NaN or Inf in either log-prob at a masked position reaches no KL value and no
    # gradient, for every estimator (k2/k3 square or exponentiate delta).
    rng, lp, base, _, mask = _batch(12, 5, 20, torch.float32, masked_rows=(3,))
    dirty_lp, dirty_base = poison(lp, mask, sentinel), poison(base, mask, -sentinel)
    leaf = dirty_lp.clone().requires_grad_(True)
    kl = alg.approx_kl(leaf, dirty_base, kind, mask=mask)
    assert_zero_outside(kl, mask)
    assert_ref(kl, np.where(mask.numpy(), ref.approx_kl(lp, base, kind), 0.0), torch.float32)
    alg.response_mean(kl, mask).backward()
    assert bool(torch.isfinite(leaf.grad).all())
    assert_zero_outside(leaf.grad, mask)


def test_tiny_kl_coef_gives_finite_returns():
    # The reward shaping scales d by kl_coef; nothing divides by it (kl_coef = 1e-39 is legal).
    rng, lp, old, _, mask = _batch(13, 4, 16, torch.float32, masked_rows=())
    R = torch.tensor([1.0, -1.0, 0.5, 0.0])
    got = alg.reinforce_plus_plus_returns(R, old, lp, mask, kl_coef=1e-39, gamma=0.9)
    assert_ref(got, ref.rpp_returns(R, old, lp, mask, kl_coef=1e-39, gamma=0.9), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
def test_second_backward_through_retained_graph(dtype):
    rng, lp, old, adv, mask = _batch(2, 4, 30, dtype)
    for f in LOSSES.values():
        leaf = lp.clone().requires_grad_(True)
        pg = f(leaf, old, adv, mask)
        loss = alg.response_mean(pg, mask) + alg.token_mean(pg, mask)
        (g1,) = torch.autograd.grad(loss, leaf, retain_graph=True)
        keep = g1.clone()
        (g2,) = torch.autograd.grad(loss, leaf)
        assert torch.equal(g1, keep) and torch.equal(g2, g1)


def test_outputs_survive_backward():
    rng, lp, old, adv, mask = _batch(3, 4, 20, torch.float32)
    leaf = lp.clone().requires_grad_(True)
    pg, clipped = alg.ppo_clip_loss(leaf, old, adv, mask)
    before = (pg.detach().clone(), clipped.clone())
    alg.response_mean(pg, mask).backward()
    assert torch.equal(pg.detach(), before[0]) and torch.equal(clipped, before[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_values_and_gradients(dtype):
    rng, lp, old, adv, mask = _batch(4, 7, 33, dtype, masked_rows=(0, 5))
    v = poison(adv, mask, rng=rng)
    rel = 1e-9 if dtype == torch.float64 else 1e-5
    for num in (None, 11, torch.tensor(13.0, dtype=dtype)):
        loss, g = _grad(lambda x, num=num: alg.response_mean(x, mask, num_responses=num), v)
        B = mask.shape[0] if num is None else float(num)
        assert float(loss) == pytest.approx(ref.response_mean(adv, mask, num_responses=B), rel=rel)
        expect = _per_response_mean_weights(mask) * mask.shape[0] / B
        assert_ref(g, expect, dtype, scale=float(expect.max()))
    n = int(mask.sum())
    loss, g = _grad(lambda x: alg.token_mean(x, mask), v)
    assert float(loss) == pytest.approx(adv.double().numpy()[mask.numpy()].sum() / n, rel=rel)
    assert_ref(g, np.where(mask.numpy(), 1.0 / n, 0.0), dtype, scale=1.0 / n)


def test_non_contiguous_inputs_and_no_grad():
    rng, lp, old, adv, mask = _batch(5, 6, 16, torch.float32)
    lp_t, old_t, adv_t = (x.t().contiguous().t() for x in (lp, old, adv))
    mask_s = torch.cat([mask, mask[:, :3]], dim=1)[:, :16]
    assert not lp_t.is_contiguous() and not mask_s.is_contiguous()
    pg, clipped = alg.ppo_clip_loss(lp_t, old_t, adv_t, mask_s)
    ref_pg, ref_flags = ref.ppo_clip_loss(lp, old, adv, mask)
    assert_ref(pg, ref_pg, torch.float32)
    with torch.no_grad():
        pg2, _ = alg.ppo_clip_loss(lp, old, adv, mask)
        r = alg.response_mean(pg2, mask_s)
    assert torch.equal(pg2, pg)
    assert float(r) == pytest.approx(ref.response_mean(ref_pg, mask), rel=1e-5)


def test_low_precision_log_probs_get_gradients_in_their_dtype():
    rng, lp, old, adv, mask = _batch(6, 3, 12, torch.float32)
    leaf = lp.to(torch.bfloat16).requires_grad_(True)
    alg.response_mean(alg.ppo_clip_loss(leaf, old, adv, mask)[0], mask).backward()
    assert leaf.grad.dtype == torch.bfloat16
    _, g = _grad(lambda x: alg.response_mean(alg.ppo_clip_loss(x, old, adv, mask)[0], mask),
                 leaf.detach().float())
    torch.testing.assert_close(leaf.grad.float(), g.to(torch.bfloat16).float(), rtol=0, atol=0)
