"""The unbiased pass@k estimator against a brute-force count over every k-subset."""

from __future__ import annotations

import itertools
import math

import pytest

from relax.eval.passk import ks_for, mean_pass_at_k, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (the first c passing) holding a passing sample."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_matches_brute_force_for_every_n_c_k(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_closed_form_large_n_and_edges():
    # against exact rational binomials where brute force is out of reach
    n, c, k = 200, 7, 50
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(10, 0, 3) == 0.0 and pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # pass@1 is the pass rate
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: every draw holds a pass


def test_bad_arguments_are_errors():
    for args in ((0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)):
        with pytest.raises(ValueError):
            pass_at_k(*args)
    with pytest.raises(TypeError):
        pass_at_k(4.0, 2, 1)


def test_ks_and_mean():
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]
    assert mean_pass_at_k([(4, 0), (4, 4), (4, 2)], 2) == pytest.approx(
        (0 + 1 + brute_force(4, 2, 2)) / 3)
    with pytest.raises(ValueError):
        ks_for(0)


def test_passk_sums_equal_the_per_group_means():
    from relax.eval.passk import PassAtKSums

    sums = PassAtKSums(4, pass_threshold=1.0, means=("response_length",))
    groups = [([1.0, 0.0, 0.0, 1.0], [3, 4, 5, 6]), ([0.0, 0.0, 0.5, 0.0], [1, 1, 1, 1])]
    for rewards, lengths in groups:
        sums.add_group(rewards, response_length=lengths)
    sums.add_group([1.0] * 4, weight=0.0, response_length=[9] * 4)  # padding counts nothing
    out = sums.metrics("s")
    for k in (1, 2, 4):
        expected = mean_pass_at_k([(4, 2), (4, 0)], k)
        assert out[f"eval/s/pass@{k}"] == pytest.approx(expected, abs=1e-12)
    assert out["eval/s/mean_reward"] == pytest.approx(2.5 / 8)
    assert out["eval/s/response_length"] == pytest.approx(22 / 8)
    # the all-reduced totals of two identical ranks give the same means
    assert sums.metrics("s", totals=[2 * v for v in sums.values]) == pytest.approx(out)
    with pytest.raises(ValueError, match="expected 4 rewards"):
        sums.add_group([1.0], response_length=[1])
