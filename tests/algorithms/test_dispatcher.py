"""Integration: compute_advantages_and_returns end to end for every estimator.

Advantages, returns and every ``rollout/...`` metric are checked against the float64
reference dispatcher (tests/algorithms/reference.py), which composes only reference math.
"""

import math
import zlib

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from relax.config.sections import AlgorithmSection
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside, out_dtype, poison, random_mask
from tests.algorithms.reference import advantage_section

METRIC_KEYS = {
    "rollout/raw_reward", "rollout/returns", "rollout/advantages",
    "rollout/advantage_raw_mean", "rollout/advantage_raw_std",
    "rollout/advantage_normalized_mean", "rollout/advantage_normalized_std",
    "rollout/valid_tokens", "rollout/advantage_zero_variance",
}

# (id, settings kwargs); reinforce_plus_plus and the baseline follow the recipes of
# reinforce_plus_plus.md §8.
CASES = [
    ("rpp_recipe", dict(estimator="reinforce_plus_plus", normalize_advantages=True, gamma=1.0,
                        kl_coef=0.01)),
    ("rpp_gamma099", dict(estimator="reinforce_plus_plus", normalize_advantages=True,
                          gamma=0.99, kl_coef=0.05)),
    ("rpp_no_kl", dict(estimator="reinforce_plus_plus", normalize_advantages=True)),
    ("baseline_recipe", dict(estimator="reinforce_plus_plus_baseline", normalize_advantages=True,
                             kl_coef=0.0)),
    ("grpo", dict(estimator="grpo")),
    ("grpo_no_std", dict(estimator="grpo", std_normalization=False)),
    ("grpo_whiten", dict(estimator="grpo", normalize_advantages=True)),
    ("grpo_whiten_no_std", dict(estimator="grpo", normalize_advantages=True,
                                std_normalization=False)),
    ("gspo", dict(estimator="gspo")),
    ("sapo", dict(estimator="sapo", normalize_advantages=True)),
    ("cispo", dict(estimator="cispo")),
    ("cispo_whiten_no_std", dict(estimator="cispo", normalize_advantages=True,
                                 std_normalization=False)),
    ("rloo", dict(estimator="rloo")),
]


def make_rollout(seed, B=8, T=10, dtype=torch.float32, group_size=4, masked_rows=(5,)):
    rng = np.random.default_rng(seed)
    mask = random_mask(rng, B, T, masked_rows=masked_rows)
    rewards = torch.tensor(rng.choice([0.0, 1.0], size=B) + rng.normal(0, 0.1, size=B),
                           dtype=dtype)
    group_index = torch.arange(B) // group_size
    old = torch.tensor(rng.normal(-1.2, 0.6, size=(B, T)), dtype=dtype)
    refl = torch.tensor(rng.normal(-1.2, 0.6, size=(B, T)), dtype=dtype)
    return rng, rewards, mask, group_index, old, refl


def run_both(kw, rewards, mask, group_index, old, refl, sentinels_rng=None):
    settings = advantage_section(**kw)
    o, r = old, refl
    if sentinels_rng is not None:
        o, r = poison(old, mask, rng=sentinels_rng), poison(refl, mask, rng=sentinels_rng)
    out = alg.compute_advantages_and_returns(settings, rewards, mask, group_index=group_index,
                                             old_log_probs=o, ref_log_probs=r)
    rkw = {k: v for k, v in kw.items() if k != "estimator"}
    expected = ref.advantages_and_returns(kw["estimator"], rewards, mask, group_index=group_index,
                                          old_log_probs=old, ref_log_probs=refl, **rkw)
    return out, expected


def check_metrics(metrics, expected, dtype, what=""):
    assert set(metrics) == METRIC_KEYS, f"{what}: metric keys {sorted(metrics)}"
    for key, want in expected.items():
        v = metrics[key]
        assert isinstance(v, torch.Tensor) and v.dim() == 0, f"{what}: {key} not a 0-d tensor"
        assert v.dtype == torch.float64, f"{what}: {key} dtype {v.dtype}"
        tol = 1e-10 if dtype == torch.float64 else 2e-5
        assert abs(float(v) - want) <= tol * max(1.0, abs(want)), \
            f"{what}: {key} = {float(v)!r}, reference {want!r}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("case_id, kw", CASES, ids=[c[0] for c in CASES])
def test_dispatcher_matches_reference(case_id, kw, dtype):
    rng, rewards, mask, gi, old, refl = make_rollout(zlib.crc32(case_id.encode()) % 1000, dtype=dtype)
    out, (adv, returns, metrics) = run_both(kw, rewards, mask, gi, old, refl, sentinels_rng=rng)
    assert out.advantages.dtype == out_dtype(dtype)
    assert out.returns.dtype == out_dtype(dtype)
    assert_ref(out.advantages, adv, dtype, what=f"{case_id} advantages")
    assert_ref(out.returns, returns, dtype, what=f"{case_id} returns")
    assert_zero_outside(out.advantages, mask)
    assert_zero_outside(out.returns, mask)
    check_metrics(out.metrics, metrics, dtype, case_id)
    # The stats object feeds the same numbers.
    assert int(out.stats.count) == int(metrics["rollout/valid_tokens"])
    assert float(out.stats.mean) == pytest.approx(metrics["rollout/advantage_raw_mean"],
                                                  abs=1e-5)
    assert math.sqrt(float(out.stats.var)) == pytest.approx(
        metrics["rollout/advantage_raw_std"], rel=1e-4, abs=1e-6)
    assert bool(out.stats.zero_variance) == bool(metrics["rollout/advantage_zero_variance"])
    if kw.get("normalize_advantages"):
        assert abs(metrics["rollout/advantage_normalized_mean"]) < 1e-6


def test_rpp_zero_rewards_nonzero_kl_returns_metric():
    # §6, §10: the k1 shaping shows in rollout/returns even with all-zero rewards.
    _, rewards, mask, gi, old, refl = make_rollout(11)
    rewards = torch.zeros_like(rewards)
    kw = CASES[0][1]
    out, (adv, returns, metrics) = run_both(kw, rewards, mask, gi, old, refl)
    assert float(out.metrics["rollout/raw_reward"]) == 0.0
    assert float(out.metrics["rollout/returns"]) != 0.0
    assert bool(torch.isfinite(out.advantages).all())
    check_metrics(out.metrics, metrics, torch.float32)


def test_baseline_all_equal_rewards_zero_variance():
    _, rewards, mask, gi, old, refl = make_rollout(12)
    out, (_, _, metrics) = run_both(CASES[3][1], torch.full_like(rewards, 0.5), mask, gi, old, refl)
    assert float(out.advantages.abs().max()) <= 1e-6
    assert float(out.metrics["rollout/advantage_zero_variance"]) == 1.0
    check_metrics(out.metrics, metrics, torch.float32)


def test_rpp_without_kl_accepts_missing_log_probs():
    _, rewards, mask, gi, old, refl = make_rollout(13)
    settings = AlgorithmSection(advantage_estimator="reinforce_plus_plus",
                                normalize_advantages=True)
    out = alg.compute_advantages_and_returns(settings, rewards, mask)
    adv, returns, metrics = ref.advantages_and_returns("reinforce_plus_plus", rewards, mask,
                                                       normalize_advantages=True)
    assert_ref(out.advantages, adv, torch.float32)
    check_metrics(out.metrics, metrics, torch.float32)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_rpp_variants_require_normalize_advantages(estimator):
    _, rewards, mask, gi, old, refl = make_rollout(14)
    with pytest.raises(ValueError, match="normalize"):
        settings = AlgorithmSection(advantage_estimator=estimator, normalize_advantages=False)
        alg.compute_advantages_and_returns(settings, rewards, mask, group_index=gi,
                                           old_log_probs=old, ref_log_probs=refl)


def test_unknown_estimator_lists_valid_names():
    _, rewards, mask, gi, old, refl = make_rollout(15)
    with pytest.raises(ValueError) as err:
        settings = AlgorithmSection(advantage_estimator="reinforce_minus_minus",
                                         normalize_advantages=True)
        alg.compute_advantages_and_returns(settings, rewards, mask, group_index=gi)
    for name in ("estimator", "reinforce_minus_minus", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
                 "grpo", "gspo", "sapo", "cispo", "rloo"):
        assert name in str(err.value)


@pytest.mark.parametrize("estimator", ["reinforce_plus_plus_baseline", "grpo", "gspo", "sapo",
                                       "cispo", "rloo"])
def test_group_estimators_require_group_index(estimator):
    _, rewards, mask, gi, old, refl = make_rollout(16)
    with pytest.raises(ValueError, match="group_index"):
        settings = AlgorithmSection(advantage_estimator=estimator,
                                         normalize_advantages=estimator != "rloo")
        alg.compute_advantages_and_returns(settings, rewards, mask)


def test_rpp_with_kl_requires_log_probs():
    _, rewards, mask, gi, old, refl = make_rollout(17)
    with pytest.raises(ValueError, match="log_probs"):
        settings = AlgorithmSection(advantage_estimator="reinforce_plus_plus",
                                         normalize_advantages=True, kl_coef=0.01)
        alg.compute_advantages_and_returns(settings, rewards, mask)


def test_dispatcher_bad_shapes_name_argument():
    _, rewards, mask, gi, old, refl = make_rollout(18)
    settings = AlgorithmSection(advantage_estimator="reinforce_plus_plus_baseline",
                                     normalize_advantages=True)
    with pytest.raises(ValueError, match="rewards"):
        alg.compute_advantages_and_returns(settings, rewards[:-1], mask, group_index=gi)
    with pytest.raises(ValueError, match="group_index"):
        alg.compute_advantages_and_returns(settings, rewards, mask, group_index=gi[:-1])
    with pytest.raises(ValueError, match="group_index"):
        alg.compute_advantages_and_returns(settings, rewards, mask, group_index=gi.float())


def test_rloo_rejects_normalize_advantages():
    """§5a: the leave-one-out advantage keeps the reward's scale; whitening it is refused."""
    _, rewards, mask, gi, old, refl = make_rollout(19)
    with pytest.raises(ValueError, match="normalize_advantages=False"):
        alg.compute_advantages_and_returns(
            AlgorithmSection(advantage_estimator="rloo", normalize_advantages=True), rewards, mask,
            group_index=gi)


def test_rloo_metrics_are_the_raw_advantage():
    """§5a, §10: no normalization, so the normalized moments are the raw ones."""
    _, rewards, mask, gi, old, refl = make_rollout(20)
    out, (adv, _, metrics) = run_both(dict(estimator="rloo"), rewards, mask, gi, old, refl)
    assert torch.equal(out.advantages, out.returns)
    assert float(out.metrics["rollout/advantage_normalized_std"]) == pytest.approx(
        float(out.metrics["rollout/advantage_raw_std"]), rel=1e-12)
    assert float(out.advantages.abs().max()) > 0.1  # rewards in {0, 1}: a real signal
    check_metrics(out.metrics, metrics, torch.float32)
