"""Robustness of the fast paths: scan chunk boundaries, non-contiguous views, and inputs
left untouched (the performance target invites in-place work; callers' tensors must not
change).
"""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from relax.config.sections import AlgorithmSection
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, poison, random_mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.9])
def test_returns_across_scan_chunk_boundaries(dtype, gamma):
    # Lengths around likely chunk sizes; valid spans start/end at and across the boundaries.
    for T in (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257, 1000):
        rng = np.random.default_rng(T)
        mask = random_mask(rng, 3, T)
        if T > 2:
            mask[2] = False
            mask[2, 0] = mask[2, T - 1] = True  # one long hole spanning every chunk
        R = torch.tensor([1.0, -0.5, 2.0], dtype=dtype)
        old = torch.tensor(rng.normal(-1, 0.5, size=(3, T)), dtype=dtype)
        refl = torch.tensor(rng.normal(-1, 0.5, size=(3, T)), dtype=dtype)
        got = alg.reinforce_plus_plus_returns(R, poison(old, mask, float("nan")),
                                              poison(refl, mask, float("inf")), mask,
                                              kl_coef=0.05, gamma=gamma)
        assert_ref(got, ref.rpp_returns(R, old, refl, mask, kl_coef=0.05, gamma=gamma), dtype,
                   what=f"T={T}")


def test_non_contiguous_views_match_contiguous():
    rng = np.random.default_rng(1)
    B, T = 5, 9
    big = torch.tensor(rng.normal(-1, 0.5, size=(4, B, 2 * T)))
    old, refl, lp, A = (big[k, :, ::2] for k in range(4))  # strided views
    assert not old.is_contiguous()
    mask_big = random_mask(rng, B, 2 * T)
    mask = mask_big[:, ::2]
    mask[:, 0] = True
    R = torch.tensor(rng.normal(size=2 * B))[::2]
    gi = torch.tensor([0, 0, 1, 1, 1, 9, 9, 9, 9, 9])[::2]
    c = lambda x: x.contiguous()  # noqa: E731
    pairs = [
        (alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.1, gamma=0.9),
         alg.reinforce_plus_plus_returns(c(R), c(old), c(refl), c(mask), kl_coef=0.1, gamma=0.9)),
        (alg.reinforce_plus_plus_baseline_advantages(R, gi, mask),
         alg.reinforce_plus_plus_baseline_advantages(c(R), c(gi), c(mask))),
        (alg.group_relative_advantages(R, gi, mask),
         alg.group_relative_advantages(c(R), c(gi), c(mask))),
        (alg.masked_population_normalize(A, mask)[0],
         alg.masked_population_normalize(c(A), c(mask))[0]),
        (alg.masked_whiten(A, mask), alg.masked_whiten(c(A), c(mask))),
        (alg.ppo_clip_loss(lp, old, A, mask)[0], alg.ppo_clip_loss(c(lp), c(old), c(A), c(mask))[0]),
        (alg.gspo_loss(lp, old, A, mask, eps_clip=0.2)[0],
         alg.gspo_loss(c(lp), c(old), c(A), c(mask), eps_clip=0.2)[0]),
        (alg.sapo_loss(lp, old, A, mask), alg.sapo_loss(c(lp), c(old), c(A), c(mask))),
        (alg.rloo_advantages(R, gi, mask), alg.rloo_advantages(c(R), c(gi), c(mask))),
        (alg.cispo_loss(lp, old, A, mask)[0], alg.cispo_loss(c(lp), c(old), c(A), c(mask))[0]),
        (alg.rloo_loss(lp, A, mask), alg.rloo_loss(c(lp), c(A), c(mask))),
    ]
    for k, (a, b) in enumerate(pairs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=f"pair {k}")
    assert_ref(pairs[0][0], ref.rpp_returns(R, old, refl, mask, kl_coef=0.1, gamma=0.9),
               torch.float64)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_inputs_are_not_modified(dtype):
    rng = np.random.default_rng(2)
    B, T = 6, 8
    mask = random_mask(rng, B, T, masked_rows=(2,))
    R = torch.tensor(rng.choice([0.0, 1.0], size=B), dtype=dtype)
    gi = torch.arange(B) // 3
    old = poison(torch.tensor(rng.normal(-1, 0.5, size=(B, T)), dtype=dtype), mask, rng=rng)
    refl = poison(torch.tensor(rng.normal(-1, 0.5, size=(B, T)), dtype=dtype), mask, rng=rng)
    lp = poison(torch.tensor(rng.normal(-1, 0.5, size=(B, T)), dtype=dtype), mask, rng=rng)
    A = poison(torch.tensor(rng.normal(size=(B, T)), dtype=dtype), mask, rng=rng)
    tensors = dict(mask=mask, R=R, gi=gi, old=old, refl=refl, lp=lp, A=A)
    before = {k: v.clone() for k, v in tensors.items()}

    alg.approx_kl(lp, refl, "low_var_kl")
    alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.01, gamma=0.99)
    alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.01, gamma=1.0)
    alg.reinforce_plus_plus_baseline_advantages(R, gi, mask)
    alg.group_relative_advantages(R, gi, mask)
    alg.masked_population_normalize(A, mask)
    alg.masked_whiten(A, mask)
    alg.ppo_clip_loss(lp, old, A, mask, eps_clip_c=3.0)
    alg.gspo_loss(lp, old, A, mask, eps_clip=0.2)
    alg.sapo_loss(lp, old, A, mask)
    alg.rloo_advantages(R, gi, mask)
    alg.cispo_loss(lp, old, A, mask)
    alg.rloo_loss(lp, A, mask)
    alg.response_mean(A, mask)
    alg.token_mean(A, mask)
    for est in alg.ESTIMATORS:
        normalize = alg.ESTIMATORS[est].facts.normalization != "none"  # rloo: never (§5a)
        settings = AlgorithmSection(advantage_estimator=est, normalize_advantages=normalize,
                                         kl_coef=0.01 if est == "reinforce_plus_plus" else 0.0)
        alg.compute_advantages_and_returns(settings, R, mask, group_index=gi,
                                           old_log_probs=old, ref_log_probs=refl,
                                           values=lp)  # read by ppo only (§5c)
        alg.compute_policy_loss(est, lp, old, A, mask)
    for k, v in tensors.items():
        assert torch.equal(v.isnan(), before[k].isnan()) if v.is_floating_point() else True
        same = torch.where(v.isnan(), 0, v) if v.is_floating_point() else v
        ref_v = torch.where(before[k].isnan(), 0, before[k]) if v.is_floating_point() \
            else before[k]
        assert torch.equal(same, ref_v), f"input {k} was modified"


def test_earlier_outputs_survive_later_calls():
    """No buffer is shared between calls: a second call must not overwrite the first result."""
    outs = []
    for seed in (3, 4):
        rng = np.random.default_rng(seed)
        B, T = 6, 40
        mask = random_mask(rng, B, T)
        R = torch.tensor(rng.normal(size=B), dtype=torch.float32)
        old = torch.tensor(rng.normal(-1, 0.5, size=(B, T)), dtype=torch.float32)
        refl = torch.tensor(rng.normal(-1, 0.5, size=(B, T)), dtype=torch.float32)
        gi = torch.arange(B) // 3
        res = [alg.reinforce_plus_plus_returns(R, old, refl, mask, kl_coef=0.01, gamma=0.99),
               alg.masked_population_normalize(old, mask)[0],
               alg.ppo_clip_loss(old, refl, old, mask)[0]]
        for est in ("reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo"):
            o = alg.compute_advantages_and_returns(
                AlgorithmSection(advantage_estimator=est, normalize_advantages=True,
                                      kl_coef=0.01 if est == "reinforce_plus_plus" else 0.0),
                R, mask, group_index=gi, old_log_probs=old, ref_log_probs=refl)
            res += [o.advantages, o.returns, *o.metrics.values()]
        outs.append((res, [r.clone() for r in res]))
    first, snapshot = outs[0]
    for k, (now, then) in enumerate(zip(first, snapshot, strict=True)):
        assert torch.equal(now, then), f"output {k} of the first call changed after the second"


def test_dispatcher_returns_and_advantages_are_distinct_for_rpp():
    # returns = G before normalization; advantages = normalized G (reinforce_plus_plus.md §3):
    # never one buffer.
    rng = np.random.default_rng(5)
    mask = random_mask(rng, 4, 12)
    R = torch.tensor([1.0, 0.0, 1.0, 0.0])
    lp = torch.tensor(rng.normal(-1, 0.5, size=(4, 12)), dtype=torch.float32)
    o = alg.compute_advantages_and_returns(
        AlgorithmSection(advantage_estimator="reinforce_plus_plus", normalize_advantages=True,
                              kl_coef=0.01), R, mask, old_log_probs=lp, ref_log_probs=lp * 1.1)
    assert o.advantages.data_ptr() != o.returns.data_ptr()
    assert_ref(o.returns, ref.rpp_returns(R, lp, lp * 1.1, mask, kl_coef=0.01), torch.float32)
