"""RLOO and CISPO (reinforce_plus_plus.md §5a, §5b) against the float64 reference and by hand:
the leave-one-out baseline, the capped detached weight, what the gradient is (and what it
is not: no path through the weight, the old log-probs or the advantages), masks, and the
global token mean under any split of the rows."""

import math

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside, out_dtype, poison, random_mask

DTYPES = [torch.float64, torch.float32]
CLIP = dict(eps_clip=0.2, eps_clip_high=0.28)


def _batch(seed, B, T, dtype, masked_rows=(1,)):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    old = rng.normal(-1.5, 0.7, size=(B, T))
    lp = old + rng.normal(0.0, 0.6, size=(B, T))  # ratios beyond both bounds
    adv = rng.normal(0.0, 1.0, size=(B, T))
    return rng, *(torch.tensor(x, dtype=dtype) for x in (lp, old, adv)), mask


def _grad(fn, lp):
    leaf = lp.detach().clone().requires_grad_(True)
    loss = fn(leaf)
    (g,) = torch.autograd.grad(loss, leaf)
    return loss.detach(), g


# ------------------------------------------------------------------------- RLOO (§5a)


def test_rloo_by_hand():
    # group 7: rewards 1, 0, 0.5, 0.5 -> each minus the mean of the other three;
    # group 3: one member, no baseline -> 0; group 5: two members -> +-(difference)
    R = torch.tensor([1.0, 0.0, 0.5, 0.5, 2.0, 3.0, 1.0], dtype=torch.float64)
    gi = torch.tensor([7, 7, 7, 7, 3, 5, 5])
    mask = torch.ones(7, 2, dtype=torch.bool)
    mask[2] = False  # fully masked: no tokens, still a member of its group
    got = alg.rloo_advantages(R, gi, mask)
    want = [1 - 1 / 3, 0 - 2 / 3, 0.0, 0.5 - 0.5, 0.0, 2.0, -2.0]
    assert_ref(got, np.where(mask.numpy(), np.array(want)[:, None], 0.0), torch.float64)
    assert_ref(got, ref.rloo_advantages(R, gi, mask), torch.float64)


@pytest.mark.parametrize("dtype", DTYPES + [torch.bfloat16])
def test_rloo_matches_reference_with_uneven_groups(dtype):
    rng = np.random.default_rng(3)
    B, T = 11, 9
    mask = random_mask(rng, B, T, masked_rows=(4,))
    R = torch.tensor(rng.normal(0.3, 2.0, size=B), dtype=dtype)
    gi = torch.tensor([2, 2, 2, 9, 9, 0, 0, 0, 0, 0, 4])  # sizes 3, 2, 5 and a group of one
    got = alg.rloo_advantages(R, gi, mask)
    assert got.dtype == out_dtype(dtype)
    assert_ref(got, ref.rloo_advantages(R, gi, mask), out_dtype(dtype))
    assert_zero_outside(got, mask)
    assert float(got[10].abs().max()) == 0.0


def test_rloo_is_the_scaled_inclusive_baseline_and_ignores_its_own_reward():
    """A_i = n/(n-1) (R_i - mean_g R) for a group of n; and b_i does not read R_i, so moving
    R_i by d moves A_i by exactly d (the baseline that keeps the estimator unbiased)."""
    rng = np.random.default_rng(4)
    B, n = 12, 4
    R = torch.tensor(rng.normal(size=B), dtype=torch.float64)
    gi = torch.arange(B) // n
    mask = torch.ones(B, 3, dtype=torch.bool)
    got = alg.rloo_advantages(R, gi, mask)
    assert_ref(got, n / (n - 1) * ref.baseline_advantages(R, gi, mask), torch.float64)
    moved = R.clone()
    moved[5] += 0.75
    delta = alg.rloo_advantages(moved, gi, mask) - got
    assert float(delta[5, 0]) == pytest.approx(0.75, abs=1e-12)
    others = [i for i in range(4, 8) if i != 5]  # the rest of its group: baseline shifts
    assert torch.allclose(delta[others, 0], torch.full((3,), -0.25, dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rloo_loss_and_gradient(dtype):
    rng, lp, old, adv, mask = _batch(5, 6, 20, dtype)
    pg = alg.rloo_loss(poison(lp, mask, rng=rng), poison(adv, mask, rng=rng), mask)
    assert_ref(pg, ref.rloo_loss(lp, adv, mask), dtype)
    assert_zero_outside(pg, mask)
    n = int(mask.sum())
    loss, g = _grad(lambda x: alg.token_mean(alg.rloo_loss(x, adv, mask), mask), lp)
    assert float(loss) == pytest.approx(ref.token_mean(ref.rloo_loss(lp, adv, mask), mask),
                                        rel=1e-9 if dtype == torch.float64 else 1e-5)
    assert_ref(g, np.where(mask.numpy(), -ref.f64(adv) / n, 0.0), dtype, scale=1.0 / n)


def test_rloo_loss_names_bad_arguments():
    z, m = torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="advantages"):
        alg.rloo_loss(z, torch.zeros(2, 4), m)
    with pytest.raises(ValueError, match="log_probs"):
        alg.rloo_loss(torch.zeros(3, 3), z, m)


# ------------------------------------------------------------------------ CISPO (§5b)


def test_cispo_by_hand():
    # eps_low 0.2, eps_high 0.28, log pi_old = -1 everywhere; rho, A -> w, clipped:
    #  1.5, +1 -> min(1.5, 1.28) = 1.28  clipped (PPO would drop this token's gradient)
    #  0.5, +1 -> 0.5                    not clipped
    #  0.5, -1 -> max(0.5, 0.8)  = 0.8   clipped (PPO would drop it too)
    #  1.5, -1 -> 1.5                    not clipped (no cap for A < 0, as in PPO)
    #  1.1, +2 -> 1.1                    inside the range
    #  1.0,  0 -> 1.0                    A = 0 counts as A >= 0, contributes 0
    rho = [1.5, 0.5, 0.5, 1.5, 1.1, 1.0]
    A = [1.0, 1.0, -1.0, -1.0, 2.0, 0.0]
    w = [1.28, 0.5, 0.8, 1.5, 1.1, 1.0]
    lp = torch.tensor([[math.log(r) - 1.0 for r in rho]], dtype=torch.float64)
    old = torch.full((1, 6), -1.0, dtype=torch.float64)
    mask = torch.ones(1, 6, dtype=torch.bool)
    pg, clipped = alg.cispo_loss(lp, old, torch.tensor([A], dtype=torch.float64), mask, **CLIP)
    want = [[-wi * a * (math.log(r) - 1.0) for wi, a, r in zip(w, A, rho, strict=True)]]
    assert_ref(pg, want, torch.float64)
    assert clipped.tolist() == [[True, False, True, False, False, False]]
    rpg, rw, rflags = ref.cispo_loss(lp, old, [A], mask, **CLIP)
    np.testing.assert_allclose(rw, [w], atol=1e-12)
    assert rflags.tolist() == clipped.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("clip", [CLIP, dict(eps_clip=0.2), dict(eps_clip=0.1, eps_clip_high=10.0)])
def test_cispo_values_flags_and_gradient(dtype, clip):
    rng, lp, old, adv, mask = _batch(6, 6, 30, dtype)
    dirty = [poison(x, mask, rng=rng) for x in (lp, old, adv)]
    pg, clipped = alg.cispo_loss(*dirty, mask, **clip)
    rpg, w, rflags = ref.cispo_loss(lp, old, adv, mask, **clip)
    assert pg.dtype == out_dtype(dtype)
    assert_ref(pg, rpg, dtype)
    assert_zero_outside(pg, mask)
    assert np.array_equal(clipped.numpy(), rflags) and clipped.any()
    n = int(mask.sum())
    _, g = _grad(lambda x: alg.token_mean(alg.cispo_loss(x, *dirty[1:], mask, **clip)[0],
                                          mask), dirty[0])
    # the weight is a constant: d/dlogp of -w A logp is -w A, on clipped tokens too
    expect = np.where(mask.numpy(), -w * ref.f64(adv) / n, 0.0)
    assert_ref(g, expect, dtype, scale=float(np.abs(expect).max()))
    assert_zero_outside(g, mask)


def test_cispo_keeps_the_gradient_that_ppo_drops():
    rng, lp, old, adv, mask = _batch(7, 5, 40, torch.float64)
    _, g_ppo = _grad(lambda x: alg.token_mean(alg.ppo_clip_loss(x, old, adv, mask, **CLIP)[0],
                                              mask), lp)
    _, g_cispo = _grad(lambda x: alg.token_mean(alg.cispo_loss(x, old, adv, mask, **CLIP)[0],
                                                mask), lp)
    dropped = mask & (g_ppo == 0) & (adv != 0)
    assert bool(dropped.any())
    assert bool((g_cispo[dropped] != 0).all())
    # and the direction is the REINFORCE direction: the sign of A, never reversed
    assert bool((torch.sign(g_cispo[mask]) == -torch.sign(adv[mask])).all())


def test_cispo_on_policy_is_the_reinforce_gradient_of_rloo():
    """At rho = 1 every weight is 1: CISPO's gradient is RLOO's -A / N."""
    rng, lp, _, adv, mask = _batch(8, 4, 16, torch.float64)
    _, g_cispo = _grad(lambda x: alg.token_mean(alg.cispo_loss(x, x.detach(), adv, mask)[0],
                                                mask), lp)
    _, g_rloo = _grad(lambda x: alg.token_mean(alg.rloo_loss(x, adv, mask), mask), lp)
    torch.testing.assert_close(g_cispo, g_rloo, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", ["cispo", "rloo"])
def test_no_gradient_reaches_old_log_probs_or_advantages(kind):
    rng, lp, old, adv, mask = _batch(9, 4, 12, torch.float64)
    lp, old, adv = (x.clone().requires_grad_(True) for x in (lp, old, adv))
    pg = (alg.cispo_loss(lp, old, adv, mask)[0] if kind == "cispo"
          else alg.rloo_loss(lp, adv, mask))
    alg.token_mean(pg, mask).backward()
    assert lp.grad is not None and bool(lp.grad.abs().sum() > 0)
    assert old.grad is None and adv.grad is None


@pytest.mark.parametrize("kind", ["cispo", "rloo"])
def test_zero_advantage_rows_give_exactly_zero_loss_and_gradient(kind):
    """The update skips the backward of such rows (relax/trainer/policy/update.py ``inert_rows``)."""
    rng, lp, old, adv, mask = _batch(10, 5, 12, torch.float64, masked_rows=())
    adv[[0, 3]] = 0.0
    f = ((lambda x: alg.cispo_loss(x, old, adv, mask)[0]) if kind == "cispo"
         else (lambda x: alg.rloo_loss(x, adv, mask)))
    leaf = lp.clone().requires_grad_(True)
    pg = f(leaf)
    alg.token_mean(pg, mask).backward()
    assert bool((pg[[0, 3]] == 0).all()) and bool((leaf.grad[[0, 3]] == 0).all())
    assert bool((leaf.grad[[1, 2, 4]] != 0).any())


@pytest.mark.parametrize("kind", ["cispo", "rloo"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_global_token_mean_is_additive_over_any_row_split(kind, dtype):
    """Each micro-batch divides by the step's global token count N: the parts sum to the
    whole batch's loss and gradient, a fully masked row included."""
    rng, lp, old, adv, mask = _batch(11, 7, 8, dtype, masked_rows=(3,))
    lp, old, adv = (poison(x, mask, rng=rng) for x in (lp, old, adv))

    def tokens(x, rows):
        if kind == "cispo":
            return alg.cispo_loss(x, old[rows], adv[rows], mask[rows], **CLIP)[0]
        return alg.rloo_loss(x, adv[rows], mask[rows])

    every = torch.arange(7)
    whole, g_whole = _grad(lambda x: alg.token_mean(tokens(x, every), mask), lp)
    n = mask.sum().to(dtype)
    leaf = lp.clone().requires_grad_(True)
    total = 0.0
    for chunk in ([0, 1, 2], [3], [4, 5, 6]):
        idx = torch.tensor(chunk)
        part = alg.token_mean(tokens(leaf[idx], idx), mask[idx], num_tokens=n)
        part.backward()
        total = total + part.detach()
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, whole, **tol)
    torch.testing.assert_close(leaf.grad, g_whole, **tol)
    assert bool(torch.isfinite(leaf.grad).all())
