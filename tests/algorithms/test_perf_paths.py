"""The hand-written gradients of the fast paths (losses._PPOClip, losses._MaskedRowSum).

Each is compared with a plain autograd composition written here from SPEC 7 (torch ops,
boolean selects, autograd's own derivatives) and with the float64 reference: values,
``clipped`` flags and the gradient into ``log_probs``, float32 and float64, NaN/Inf/huge
sentinels at masked positions, a second backward through a retained graph (the first
backward writes its gradient into a buffer of the forward), non-contiguous inputs.
"""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from relax.algorithms._checks import row_counts
from tests.algorithms import reference as ref
from tests.algorithms.helpers import SENTINELS, assert_ref, assert_zero_outside, poison, random_mask

DTYPES = [torch.float64, torch.float32]
TOL = {torch.float64: dict(rtol=1e-12, atol=1e-14), torch.float32: dict(rtol=1e-6, atol=1e-7)}
CLIPS = [dict(), dict(eps_clip=0.1, eps_clip_high=0.3), dict(eps_clip=0.2, eps_clip_c=3.0)]


def _batch(seed, B, T, dtype, masked_rows=(1,)):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    old = rng.normal(-1.5, 0.7, size=(B, T))
    lp = old + rng.normal(0.0, 0.8, size=(B, T))  # ratios on both sides of both bounds
    adv = rng.normal(0.0, 1.0, size=(B, T))
    adv[:, ::5] = -np.abs(adv[:, ::5]) * 3  # some A < 0 with large ratios: dual clip active
    return rng, *(torch.tensor(x, dtype=dtype) for x in (lp, old, adv)), mask


def plain_ppo(lp, old, adv, mask, eps_clip=0.2, eps_clip_high=None, eps_clip_c=None):
    """SPEC 7 PPO clip by autograd: select first, then max of the two branches."""
    zero = torch.zeros((), dtype=lp.dtype)
    lp, old, adv = (torch.where(mask, x, zero) for x in (lp, old, adv))
    high = eps_clip if eps_clip_high is None else eps_clip_high
    rho = torch.exp(lp - old)
    unclipped, bound = -adv * rho, -adv * rho.clamp(1 - eps_clip, 1 + high)
    pg, clipped = torch.maximum(unclipped, bound), bound > unclipped
    if eps_clip_c is not None:
        dual = (adv < 0) & (-eps_clip_c * adv < pg)
        pg, clipped = torch.where(dual, -eps_clip_c * adv, pg), clipped | dual
    return torch.where(mask, pg, zero), clipped & mask


def plain_gspo(lp, old, adv, mask, eps_clip=0.2, eps_clip_high=None):
    """SPEC 7 GSPO by autograd: the sequence ratio on every valid token, then the PPO clip."""
    zero = torch.zeros((), dtype=lp.dtype)
    lp, old, adv = (torch.where(mask, x, zero) for x in (lp, old, adv))
    length = mask.sum(dim=1, keepdim=True).clamp(min=1).to(lp.dtype)
    s = torch.exp((lp - old).sum(dim=1, keepdim=True) / length).expand_as(lp)
    high = eps_clip if eps_clip_high is None else eps_clip_high
    unclipped, bound = -adv * s, -adv * s.clamp(1 - eps_clip, 1 + high)
    return torch.where(mask, torch.maximum(unclipped, bound), zero), (bound > unclipped) & mask


def plain_sapo(lp, old, adv, mask, tau_pos=1.0, tau_neg=1.05):
    """SPEC 7 SAPO gate by autograd: select first, taus in the compute dtype."""
    zero = torch.zeros((), dtype=lp.dtype)
    lp, old, adv = (torch.where(mask, x, zero) for x in (lp, old, adv))
    rho = torch.exp(lp - old)
    tau = torch.where(adv > 0, torch.tensor(tau_pos, dtype=lp.dtype), torch.tensor(tau_neg, dtype=lp.dtype))
    return torch.where(mask, -(4.0 * torch.sigmoid(tau * (rho - 1.0)) / tau) * adv, zero)


def plain_response_mean(values, mask, num_responses=None):
    v = torch.where(mask, values, torch.zeros((), dtype=values.dtype))
    per_row = v.sum(dim=1) / mask.sum(dim=1).clamp(min=1).to(v.dtype)
    return per_row.sum() / (mask.shape[0] if num_responses is None else num_responses)


def _grad(loss_fn, lp):
    leaf = lp.detach().clone().requires_grad_(True)
    loss = loss_fn(leaf)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kw", CLIPS)
def test_ppo_function_equals_plain_autograd_and_reference(dtype, kw):
    rng, lp, old, adv, mask = _batch(0, 6, 40, dtype)
    pg, clipped = alg.ppo_clip_loss(lp, old, adv, mask, **kw)
    ppg, pclipped = plain_ppo(lp, old, adv, mask, **kw)
    torch.testing.assert_close(pg, ppg, **TOL[dtype])
    assert torch.equal(clipped, pclipped)
    assert clipped.any() and (mask & ~clipped).any()  # both branches exercised
    assert_ref(pg, ref.ppo_clip_loss(lp, old, adv, mask, **kw)[0], dtype)

    loss, g = _grad(lambda x: alg.response_mean(alg.ppo_clip_loss(x, old, adv, mask, **kw)[0], mask), lp)
    ploss, pg_ = _grad(lambda x: plain_response_mean(plain_ppo(x, old, adv, mask, **kw)[0], mask), lp)
    torch.testing.assert_close(loss, ploss, **TOL[dtype])
    torch.testing.assert_close(g, pg_, **TOL[dtype])
    assert float(loss) == pytest.approx(ref.response_mean(ref.ppo_clip_loss(lp, old, adv, mask, **kw)[0], mask),
                                        rel=1e-9 if dtype == torch.float64 else 1e-5)
    # Gradient by the analytic reference: -A*rho on valid unclipped tokens, / (B * L_i).
    rho = np.exp(lp.double().numpy() - old.double().numpy())
    a, m = adv.double().numpy(), mask.numpy()
    flags = ref.ppo_clip_loss(lp, old, adv, mask, **kw)[1]  # the bounds (not the dual clip)
    if "eps_clip_c" in kw:
        c = kw["eps_clip_c"]
        flags = flags | ((a < 0) & (-c * a < np.maximum(-a * rho, -a * np.clip(rho, 0.8, 1.2))))
    expect = np.where(m & ~flags, -a * rho, 0.0)
    expect /= mask.shape[0] * np.maximum(m.sum(axis=1, keepdims=True), 1)
    assert_ref(g, expect, dtype, scale=float(np.abs(expect).max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sentinel", SENTINELS)
def test_ppo_function_masked_sentinels(dtype, sentinel):
    rng, lp, old, adv, mask = _batch(1, 5, 24, dtype, masked_rows=(2,))
    dirty = [poison(x, mask, sentinel) for x in (lp, old, adv)]
    clean = [x.masked_fill(~mask, 0.0) for x in (lp, old, adv)]
    for kw in CLIPS:
        pg_d, cl_d = alg.ppo_clip_loss(*dirty, mask, **kw)
        pg_c, cl_c = alg.ppo_clip_loss(*clean, mask, **kw)
        assert torch.equal(pg_d, pg_c) and torch.equal(cl_d, cl_c)
        assert_zero_outside(pg_d, mask)
        assert_zero_outside(cl_d, mask)
        loss_d, g_d = _grad(lambda x, kw=kw: alg.response_mean(
            alg.ppo_clip_loss(x, *dirty[1:], mask, **kw)[0], mask), dirty[0])
        _, g_c = _grad(lambda x, kw=kw: alg.response_mean(
            alg.ppo_clip_loss(x, *clean[1:], mask, **kw)[0], mask), clean[0])
        assert bool(torch.isfinite(loss_d)) and bool(torch.isfinite(g_d).all())
        assert torch.equal(g_d, g_c)
        assert_zero_outside(g_d, mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_second_backward_through_retained_graph(dtype):
    # Both Functions hand a forward buffer to the first backward, which writes its gradient
    # there; a second backward must rebuild, give the same gradient and leave the first alone.
    rng, lp, old, adv, mask = _batch(2, 4, 30, dtype)
    leaf = lp.clone().requires_grad_(True)
    pg, _ = alg.ppo_clip_loss(leaf, old, adv, mask, eps_clip_c=3.0)
    loss = alg.response_mean(pg, mask) + alg.token_mean(pg, mask)
    (g1,) = torch.autograd.grad(loss, leaf, retain_graph=True)
    keep = g1.clone()
    (g2,) = torch.autograd.grad(loss, leaf)
    assert torch.equal(g1, keep)
    torch.testing.assert_close(g2, g1, rtol=0, atol=0)
    assert g2.data_ptr() != g1.data_ptr()


def test_outputs_survive_backward():
    # pg is saved for the backward and returned to the caller: the backward must not write it.
    rng, lp, old, adv, mask = _batch(3, 4, 20, torch.float32)
    leaf = lp.clone().requires_grad_(True)
    pg, clipped = alg.ppo_clip_loss(leaf, old, adv, mask)
    before = (pg.detach().clone(), clipped.clone())
    alg.response_mean(pg, mask).backward()
    assert torch.equal(pg.detach(), before[0]) and torch.equal(clipped, before[1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_equal_plain_autograd(dtype):
    rng, lp, old, adv, mask = _batch(4, 7, 33, dtype, masked_rows=(0, 5))
    v = poison(adv, mask, rng=rng)
    for num in (None, 11, torch.tensor(13.0, dtype=dtype)):
        loss, g = _grad(lambda x, num=num: alg.response_mean(x, mask, num_responses=num), v)
        ploss, pgrad = _grad(lambda x, num=num: plain_response_mean(x, mask, num), v)
        torch.testing.assert_close(loss, ploss, **TOL[dtype])
        torch.testing.assert_close(g, pgrad, **TOL[dtype])
        assert_zero_outside(g, mask)
    n = int(mask.sum())
    loss, g = _grad(lambda x: alg.token_mean(x, mask), v)
    expect = adv.double().numpy()[mask.numpy()].sum() / n
    assert float(loss) == pytest.approx(expect, rel=1e-9 if dtype == torch.float64 else 1e-5)
    torch.testing.assert_close(g, torch.where(mask, torch.tensor(1.0 / n, dtype=dtype), 0.0), **TOL[dtype])


def test_non_contiguous_inputs_and_no_grad():
    rng, lp, old, adv, mask = _batch(5, 6, 16, torch.float32)
    # Transposed storage and a column slice: same values, other strides.
    lp_t, old_t, adv_t = (x.t().contiguous().t() for x in (lp, old, adv))
    mask_s = torch.cat([mask, mask[:, :3]], dim=1)[:, :16]
    assert not lp_t.is_contiguous() and not mask_s.is_contiguous()
    pg, clipped = alg.ppo_clip_loss(lp_t, old_t, adv_t, mask_s)
    ppg, pclipped = plain_ppo(lp, old, adv, mask)
    torch.testing.assert_close(pg, ppg, **TOL[torch.float32])
    assert torch.equal(clipped, pclipped)
    with torch.no_grad():
        pg2, _ = alg.ppo_clip_loss(lp, old, adv, mask)
        r = alg.response_mean(pg2, mask_s)
    torch.testing.assert_close(pg2, ppg, **TOL[torch.float32])
    torch.testing.assert_close(r, plain_response_mean(ppg, mask), **TOL[torch.float32])


def test_low_precision_log_probs_get_gradients_in_their_dtype():
    rng, lp, old, adv, mask = _batch(6, 3, 12, torch.float32)
    leaf = lp.to(torch.bfloat16).requires_grad_(True)
    alg.response_mean(alg.ppo_clip_loss(leaf, old, adv, mask)[0], mask).backward()
    assert leaf.grad.dtype == torch.bfloat16
    _, g = _grad(lambda x: plain_response_mean(plain_ppo(x, old, adv, mask)[0], mask),
                 leaf.detach().float())
    torch.testing.assert_close(leaf.grad.float(), g.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_row_counts():
    rng = np.random.default_rng(7)
    mask = random_mask(rng, 9, 300, masked_rows=(4,))
    assert torch.equal(row_counts(mask), mask.sum(dim=1))
    view = mask[:, ::3]  # strided rows
    assert torch.equal(row_counts(view), view.sum(dim=1))
    assert row_counts(mask).dtype == torch.int64


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("estimator,normalize", [("reinforce_plus_plus_baseline", True), ("grpo", True),
                                                 ("grpo", False), ("sapo", True)])
def test_per_response_dispatch_equals_token_normalization(dtype, estimator, normalize):
    # The dispatcher normalizes per-response raw advantages on [B] weighted by L_i
    # (normalization.normalize_rows); the public token-level functions must agree.
    rng = np.random.default_rng(8)
    B, T = 12, 30
    mask = random_mask(rng, B, T, masked_rows=(3,))
    rewards = torch.tensor(rng.normal(2.0, 1.0, size=B), dtype=dtype)
    gi = torch.tensor(rng.integers(0, 4, size=B))
    out = alg.compute_advantages_and_returns(alg.AdvantageSettings(estimator, normalize), rewards, mask,
                                             group_index=gi)
    if estimator == "reinforce_plus_plus_baseline":
        raw = alg.reinforce_plus_plus_baseline_advantages(rewards, gi, mask)
        adv, stats = alg.masked_population_normalize(raw, mask)
    else:
        raw = alg.group_relative_advantages(rewards, gi, mask)
        adv = alg.masked_whiten(raw, mask) if normalize else raw
        stats = None
    tol = TOL[dtype] if dtype == torch.float64 else dict(rtol=1e-6, atol=1e-6)
    assert torch.equal(out.returns, raw)
    torch.testing.assert_close(out.advantages, adv, **tol)
    assert_zero_outside(out.advantages, mask)
    if stats is not None:
        for field in ("mean", "var", "count", "zero_variance", "normalized_mean", "normalized_std"):
            torch.testing.assert_close(getattr(out.stats, field), getattr(stats, field), rtol=1e-6, atol=1e-7)


def test_torch_paths_equal_numpy_paths(monkeypatch):
    # Accelerators run the torch branch of the helpers that take NumPy on the CPU; run both
    # here on the same inputs (sentinels included) and require identical results.
    from relax.algorithms import _checks

    rng, lp, old, adv, mask = _batch(9, 6, 35, torch.float32, masked_rows=(2,))
    lp, old, adv = (poison(x, mask, rng=rng) for x in (lp, old, adv))
    rewards = torch.tensor(rng.normal(size=6), dtype=torch.float32)
    gi = torch.tensor([0, 0, 1, 1, 2, 2])

    def run():
        leaf = lp.clone().requires_grad_(True)
        pg, clipped = alg.ppo_clip_loss(leaf, old, adv, mask, eps_clip_c=3.0)
        loss = alg.response_mean(pg, mask) + alg.token_mean(pg, mask)
        loss.backward()
        rpp = alg.compute_advantages_and_returns(alg.AdvantageSettings("reinforce_plus_plus", True, 0.9, 0.1),
                                                 rewards, mask, old_log_probs=old, ref_log_probs=adv)
        base = alg.compute_advantages_and_returns(alg.AdvantageSettings("reinforce_plus_plus_baseline", True),
                                                  rewards, mask, group_index=gi)
        other = leaf.detach().clone().requires_grad_(True)
        gspo, gclipped = alg.gspo_loss(other, old, adv, mask, eps_clip=0.2)
        (alg.response_mean(gspo, mask) + alg.response_mean(alg.sapo_loss(other, old, adv, mask), mask)).backward()
        return [pg, clipped, loss, leaf.grad, gspo, gclipped, other.grad, rpp.advantages, rpp.returns,
                base.advantages, *rpp.metrics.values(), *base.metrics.values()]

    fast = run()
    monkeypatch.setattr(_checks, "NUMPY_ON_CPU", False)
    device_path = run()
    for a, b in zip(fast, device_path, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("taus", [dict(), dict(tau_pos=0.7, tau_neg=1.3)])
def test_sapo_function_equals_plain_autograd_and_reference(dtype, taus):
    rng, lp, old, adv, mask = _batch(10, 6, 40, dtype)
    pg = alg.sapo_loss(lp, old, adv, mask, **taus)
    torch.testing.assert_close(pg, plain_sapo(lp, old, adv, mask, **taus), **TOL[dtype])
    assert_ref(pg, ref.sapo_loss(lp, old, adv, mask, **taus), dtype)
    loss, g = _grad(lambda x: alg.response_mean(alg.sapo_loss(x, old, adv, mask, **taus), mask), lp)
    _, pgrad = _grad(lambda x: plain_response_mean(plain_sapo(x, old, adv, mask, **taus), mask), lp)
    torch.testing.assert_close(g, pgrad, **TOL[dtype])
    for sentinel in SENTINELS:
        dirty = [poison(x, mask, sentinel) for x in (lp, old, adv)]
        assert torch.equal(alg.sapo_loss(*dirty, mask, **taus), pg)
        _, g_d = _grad(lambda x, d=dirty: alg.response_mean(alg.sapo_loss(x, *d[1:], mask, **taus), mask), dirty[0])
        assert torch.equal(g_d, g)
        assert_zero_outside(g_d, mask)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gspo_function_equals_plain_autograd_and_reference(dtype):
    rng, lp, old, adv, mask = _batch(11, 8, 30, dtype, masked_rows=(1,))
    lp = lp + torch.tensor(rng.normal(0, 0.4, size=(8, 1)), dtype=dtype)  # rows on both sides of the clip
    kw = dict(eps_clip=0.1, eps_clip_high=0.15)
    pg, clipped = alg.gspo_loss(lp, old, adv, mask, **kw)
    ppg, pclipped = plain_gspo(lp, old, adv, mask, **kw)
    torch.testing.assert_close(pg, ppg, **TOL[dtype])
    assert torch.equal(clipped, pclipped) and clipped.any() and (mask & ~clipped).any()
    assert_ref(pg, ref.gspo_loss(lp, old, adv, mask, **kw)[0], dtype)
    loss, g = _grad(lambda x: alg.response_mean(alg.gspo_loss(x, old, adv, mask, **kw)[0], mask), lp)
    _, pgrad = _grad(lambda x: plain_response_mean(plain_gspo(x, old, adv, mask, **kw)[0], mask), lp)
    torch.testing.assert_close(g, pgrad, **TOL[dtype])
    for sentinel in SENTINELS:
        dirty = [poison(x, mask, sentinel) for x in (lp, old, adv)]
        assert torch.equal(alg.gspo_loss(*dirty, mask, **kw)[0], pg)
        _, g_d = _grad(lambda x, d=dirty: alg.response_mean(alg.gspo_loss(x, *d[1:], mask, **kw)[0], mask),
                       dirty[0])
        assert torch.equal(g_d, g)
    # A second backward through the retained graph rebuilds the coefficient.
    leaf = lp.clone().requires_grad_(True)
    loss = alg.response_mean(alg.gspo_loss(leaf, old, adv, mask, **kw)[0], mask)
    (g1,) = torch.autograd.grad(loss, leaf, retain_graph=True)
    keep = g1.clone()
    (g2,) = torch.autograd.grad(loss, leaf)
    assert torch.equal(g1, keep) and torch.equal(g2, g1)
