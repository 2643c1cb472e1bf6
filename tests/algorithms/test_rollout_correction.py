"""reinforce_plus_plus.md §7c against float64 references written here, token by token and
row by row (no production math): the rollout importance weights of every level and mode,
the rejection rules (IcePop, sequence, geometric, K3), the veto, and the weight sums behind
the effective sample size; empty masks, rows without tokens, extreme ratios and NaN padding."""

import math

import numpy as np
import pytest
import torch

from relax.algorithms import rollout_correction as rc
from relax.algorithms.losses import response_mean, token_mean
from relax.algorithms.registry import ESTIMATORS
from relax.config.sections.algorithm import AlgorithmSection
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside, poison, random_mask

DTYPES = [torch.float64, torch.float32]


# ------------------------------------------------------------------ float64 references

def _rows(q, s, m):
    """Per row: the list of (t, d) of its masked tokens, d = q - s in float64."""
    q, s, m = q.double().numpy(), s.double().numpy(), m.numpy()
    return [[(t, float(q[i, t]) - float(s[i, t])) for t in range(m.shape[1]) if m[i, t]]
            for i in range(m.shape[0])]


def _row_log_stat(level, tokens, d):
    """The log of the weight of a token with log-ratio ``d`` in a row of ``tokens``."""
    if level == "token":
        return d
    total = math.fsum(x for _, x in tokens)
    return total if level == "sequence" else total / len(tokens)


def ref_weights(q, s, m, *, level, mode, low, high):
    w = np.zeros(tuple(m.shape))
    outside = np.zeros(tuple(m.shape), dtype=bool)
    for i, tokens in enumerate(_rows(q, s, m)):
        for t, d in tokens:
            log_w = _row_log_stat(level, tokens, d)
            lo = math.log(low) if low > 0 else -math.inf
            out = log_w < lo or log_w > math.log(high)
            outside[i, t] = out
            if mode == "truncate":
                w[i, t] = math.exp(min(max(log_w, lo), math.log(high)))
            else:
                w[i, t] = 0.0 if out else math.exp(log_w)
    return w, outside


def ref_keep(q, s, m, *, kind, low, high):
    keep = np.ones(tuple(m.shape), dtype=bool)
    for i, tokens in enumerate(_rows(q, s, m)):
        if kind == "k3":
            k3 = math.fsum(math.exp(d) - 1.0 - d for _, d in tokens) / max(len(tokens), 1)
            row_keep = k3 <= high
            for t, _ in tokens:
                keep[i, t] = row_keep
            continue
        level = "token" if kind == "token" else kind
        for t, d in tokens:
            r_log = _row_log_stat(level, tokens, d)
            lo = math.log(low) if low > 0 else -math.inf
            keep[i, t] = lo <= r_log <= math.log(high)
    return keep


def ref_veto(q, s, m, *, threshold):
    return np.array([all(math.exp(d) >= threshold for _, d in tokens)
                     for tokens in _rows(q, s, m)])


# ------------------------------------------------------------------ data

def _data(seed, dtype, B=7, T=9, spread=0.6):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=(2,))
    q = torch.as_tensor(rng.normal(-2.0, 1.0, (B, T)), dtype=dtype)
    s = q + torch.as_tensor(rng.normal(0.0, spread, (B, T)), dtype=dtype)
    return poison(q, mask, rng=rng), poison(s, mask, rng=rng), mask


LEVELS = sorted(rc.IS_LEVELS)
MODES = sorted(rc.IS_MODES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("low,high", [(0.0, 1.1), (0.5, 1.5), (0.9, 1.1)])
def test_importance_weights_equal_the_reference(level, mode, low, high, dtype):
    q, s, mask = _data(3, dtype, spread=2.0)
    w, outside = rc.importance_weights(q, s, mask, level=level, mode=mode, low=low, high=high)
    want_w, want_out = ref_weights(q, s, mask, level=level, mode=mode, low=low, high=high)
    assert_ref(w, want_w, dtype, what=f"{level}/{mode}")
    assert torch.equal(outside, torch.from_numpy(want_out))
    assert want_out.any()  # the bounds act: the test can fail
    assert_zero_outside(w, mask, "w")
    assert_zero_outside(outside, mask, "outside")
    assert w.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)


@pytest.mark.parametrize("level", LEVELS)
def test_sequence_products_never_overflow(level):
    """Ratios of e^40 on 30 tokens: a product of e^1200 (inf in float64 if formed directly)
    is bounded in log space; a product of e^-1200 is a truncated 0 or a masked 0, never NaN."""
    mask = torch.ones(2, 30, dtype=torch.bool)
    q = torch.zeros(2, 30)
    s = torch.stack([torch.full((30,), -40.0), torch.full((30,), 40.0)])
    for mode in MODES:
        w, outside = rc.importance_weights(q, s, mask, level=level, mode=mode, low=0.5,
                                           high=3.0)
        assert torch.isfinite(w).all() and bool(outside.all())
        assert torch.allclose(w[0], torch.full((30,), 3.0 if mode == "truncate" else 0.0))
        assert torch.allclose(w[1], torch.full((30,), 0.5 if mode == "truncate" else 0.0))


def test_weights_of_empty_masks_and_empty_rows():
    q = torch.full((3, 4), float("nan"))
    none = torch.zeros(3, 4, dtype=torch.bool)
    for level in LEVELS:
        for mode in MODES:
            w, outside = rc.importance_weights(q, q, none, level=level, mode=mode, low=0.5,
                                               high=2.0)
            assert not w.any() and not outside.any()
    keep = rc.rejection_keep(q, q, none, kind="k3", low=0.0, high=0.01)
    assert keep.all()
    assert rc.veto_keep(q, q, none, threshold=1e-3).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,low,high", [("token", 0.5, 2.0), ("token", 0.8, 1.25),
                                           ("sequence", 0.5, 2.0), ("geometric", 0.8, 1.25),
                                           ("k3", 0.0, 0.18), ("k3", 0.0, 0.25)])
def test_rejection_equals_the_reference(kind, low, high, dtype):
    q, s, mask = _data(5, dtype)
    keep = rc.rejection_keep(q, s, mask, kind=kind, low=low, high=high)
    want = ref_keep(q, s, mask, kind=kind, low=low, high=high)
    assert torch.equal(keep, torch.from_numpy(want))
    on = want[mask.numpy()]
    assert on.any() and not on.all()  # some kept, some dropped: the test can fail
    assert bool(keep[~mask].all())  # outside the mask: kept (inert)


def test_row_rules_drop_whole_rows():
    q, s, mask = _data(6, torch.float64)
    for kind in ("sequence", "geometric", "k3"):
        keep = rc.rejection_keep(q, s, mask, kind=kind, low=0.8, high=1.25 if kind != "k3"
                                 else 0.2)
        for i in range(len(mask)):
            values = keep[i][mask[i]]
            assert values.all() or not values.any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threshold", [0.3, 0.6])
def test_veto_equals_the_reference(threshold, dtype):
    q, s, mask = _data(7, dtype, spread=0.8)
    got = rc.veto_keep(q, s, mask, threshold=threshold)
    want = ref_veto(q, s, mask, threshold=threshold)
    assert torch.equal(got, torch.from_numpy(want))
    assert want.any() and not want.all()


def test_extreme_ratios_are_decided_not_nan():
    """A token the trainer gives probability 0 (q = -inf): its ratio is 0, vetoed, rejected by
    IcePop and K3 (an infinite divergence), truncated to the lower bound."""
    mask = torch.ones(1, 3, dtype=torch.bool)
    q = torch.tensor([[-1.0, -math.inf, -2.0]])
    s = torch.tensor([[-1.0, -3.0, -2.0]])
    assert not rc.veto_keep(q, s, mask, threshold=1e-4).any()
    assert rc.rejection_keep(q, s, mask, kind="token", low=0.5, high=2.0).tolist() == [
        [True, False, True]]
    assert not rc.rejection_keep(q, s, mask, kind="k3", low=0.0, high=10.0).any()
    w, _ = rc.importance_weights(q, s, mask, level="token", mode="truncate", low=0.25, high=2)
    assert w.tolist() == [[1.0, 0.25, 1.0]]


def test_weights_carry_no_gradient():
    q, s, mask = _data(8, torch.float64)
    q = q.clone().requires_grad_()
    for level in LEVELS:
        w, _ = rc.importance_weights(q, s, mask, level=level, mode="truncate", low=0, high=2)
        assert not w.requires_grad


def test_weight_sums():
    q, s, mask = _data(9, torch.float64)
    w, _ = rc.importance_weights(q, s, mask, level="token", mode="truncate", low=0.0, high=2.0)
    got = rc.weight_sums(w, mask).tolist()
    ws = [float(x) for x in w[mask].tolist()]
    want = [float(len(ws)), math.fsum(ws), math.fsum(x * x for x in ws), max(ws)]
    assert np.allclose(got, want, rtol=1e-12, atol=0)
    empty = rc.weight_sums(torch.full((2, 3), float("nan")), torch.zeros(2, 3, dtype=bool))
    assert empty.tolist() == [0.0, 0.0, 0.0, 0.0]


# ------------------------------------------------- the weight in every estimator's policy loss

def _local_ref(kind, lp, old, adv, m, eps_low, eps_high, tau_pos, tau_neg):
    """float64 ``(pg [B, T], d pg[i,t] / d lp[i,t] [B, T])`` of a per-token policy loss (§5a,
    §5b, §7), from tests/algorithms/reference.py's values and the derivatives written here."""
    rho = np.exp(lp - old)
    if kind == "ppo_clip":
        pg, clipped = ref.ppo_clip_loss(lp, old, adv, m, eps_clip=eps_low, eps_clip_high=eps_high)
        return pg, np.where(clipped, 0.0, -adv * rho)  # the clipped branch is constant
    if kind == "sapo":
        tau = np.where(adv > 0, tau_pos, tau_neg)
        sig = 1.0 / (1.0 + np.exp(-tau * (rho - 1.0)))
        return (ref.sapo_loss(lp, old, adv, m, tau_pos=tau_pos, tau_neg=tau_neg),
                -adv * 4.0 * sig * (1.0 - sig) * rho)
    if kind == "cispo":
        pg, w_cispo, _ = ref.cispo_loss(lp, old, adv, m, eps_clip=eps_low, eps_clip_high=eps_high)
        return pg, -w_cispo * adv  # the CISPO weight is detached (§5b)
    if kind == "rloo":
        return ref.rloo_loss(lp, adv, m), -adv
    raise KeyError(kind)


def ref_weighted_loss(kind, lp, old, adv, m, w, *, per_token, **knobs):
    """float64 ``(L, dL / d lp)`` of §7c's ``L = reduce(w * pg)``: §7's response mean (or the
    global token mean) of each token's policy-loss term times its weight. GSPO's term is a
    function of its row's sequence ratio ``s_i``, so a token's gradient collects the weighted
    terms of its whole row: ``dL/dlp[i,t] = c_i * sum_u w[i,u] dpg[i,u]/ds_i * s_i / L_i``."""
    lengths = m.sum(-1)
    coef = np.where(lengths > 0, 1.0 / np.maximum(lengths, 1), 0.0) / m.shape[0]
    if per_token:
        coef = np.full(m.shape[0], 1.0 / m.sum())
    if kind == "gspo":
        pg, clipped = ref.gspo_loss(lp, old, adv, m, eps_clip=knobs["eps_low"],
                                    eps_clip_high=knobs["eps_high"])
        s = ref.gspo_ratios(lp, old, m)
        dpg_ds = np.where(clipped | ~m, 0.0, -adv)
        row = (w * dpg_ds).sum(-1) * s / np.maximum(lengths, 1)
        grad = m * (coef * row)[:, None]
    else:
        pg, dpg = _local_ref(kind, lp, old, adv, m, **knobs)
        grad = m * coef[:, None] * w * dpg
    return float((coef[:, None] * w * pg * m).sum()), grad


@pytest.mark.parametrize("name", sorted(ESTIMATORS))
def test_every_estimators_policy_loss_takes_the_weight(name):
    """§7c "Where it enters the loss" (and §7a's TIS weight, the same place): for every
    registered estimator, ``reduce(w * pg)`` of its production per-token policy loss and its
    gradient in the log-probs equal the float64 reference of each token's term times its
    weight. So a weight of 0 removes a token's term (and, for every per-token loss, its
    gradient; GSPO's terms share the sequence ratio, so there a row of zeros has none), and
    a weight w scales it. A new estimator needs a reference here before it passes."""
    est = ESTIMATORS[name]
    kind, per_token = est.facts.policy_loss, est.facts.requires_per_token_loss
    rng = np.random.default_rng(sorted(ESTIMATORS).index(name))
    B, T = 6, 7
    mask = random_mask(rng, B, T, masked_rows=(4,))
    m = mask.numpy()
    lp = np.log(rng.uniform(0.05, 0.9, (B, T)))
    old = lp - rng.uniform(-0.3, 0.3, (B, T))  # ratios in [0.74, 1.35]: some clipped
    adv = rng.normal(size=(B, T))
    w = rng.uniform(0.0, 2.0, (B, T)) * (rng.random((B, T)) > 0.3)  # ~30% exact zeros
    w[2] = 0.0  # a whole row weighted 0
    knobs = dict(eps_low=0.2, eps_high=0.28, tau_pos=1.0, tau_neg=1.05)
    section = AlgorithmSection(eps_clip=0.2, eps_clip_high=0.28, sapo_tau_pos=1.0,
                               sapo_tau_neg=1.05)

    def loss(weight):
        x = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
        pg, _ = est.policy_loss(x, torch.tensor(old), torch.tensor(adv), mask, section)
        weighted = pg * torch.tensor(weight)  # the factor of relax/trainer/terms (§7a, §7c)
        value = token_mean(weighted, mask) if per_token else response_mean(weighted, mask)
        value.backward()
        return value, x.grad

    try:
        want, want_grad = ref_weighted_loss(kind, lp, old, adv, m, w, per_token=per_token,
                                            **knobs)
    except KeyError:
        pytest.fail(f"{name}: no float64 reference for its policy loss {kind!r}; add one to "
                    "ref_weighted_loss so the §7c weight is checked in it")
    got, grad = loss(w)
    assert got.item() == pytest.approx(want, rel=1e-10, abs=1e-12), name
    assert_ref(grad, want_grad, torch.float64, what=f"{name}: d loss / d log-probs")
    assert torch.all(grad[2] == 0), f"{name}: a row weighted 0 still has a gradient"
    if kind != "gspo":
        zero = torch.from_numpy((w == 0) & m)
        assert zero.any() and torch.all(grad[zero] == 0), f"{name}: a token weighted 0 moved"
    # the weights change the result: without them the test could not fail
    plain, plain_grad = loss(np.ones((B, T)))
    assert plain.item() != pytest.approx(got.item(), rel=1e-6)
    assert not torch.allclose(plain_grad, grad)
