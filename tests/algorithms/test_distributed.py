"""Two real Gloo processes (reinforce_plus_plus.md §6): distributed results equal the
concatenated population.

All cases run in ONE spawn (module fixture) because starting processes dominates the cost;
each case is then asserted by its own test. A hang fails through run_distributed's timeout.
"""

import numpy as np
import pytest
import torch

import relax.algorithms as alg
from tests.algorithms import dist_cases as dc
from tests.algorithms import reference as ref
from tests.algorithms.helpers import assert_ref, assert_zero_outside
from tests.algorithms.reference import advantage_section
from tests.distributed_utils import DistributedTestError, run_distributed

# xdist_group: under `make test`'s workers the whole module stays on one, so the fixture's
# spawn happens once
pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(180),
              pytest.mark.xdist_group("algorithms-distributed")]


@pytest.fixture(scope="module")
def results():
    return run_distributed(dc.worker, dc.WORLD, timeout=90)


def _ok(results, key):
    out = []
    for rank, res in enumerate(results):
        r = res[key]
        assert r[0] == "ok", f"rank {rank} {key}: raised {r[1]}: {r[2]}"
        out.append(r[1])
    return out


@pytest.mark.parametrize("case", dc.NORMALIZE_CASES)
def test_normalize_equals_concatenated_reference(results, case):
    data = [dc.normalize_data(case, rank) for rank in range(dc.WORLD)]
    expected, rstats = ref.population_normalize([v for v, _ in data], [m for _, m in data])
    for rank, (a, stats) in enumerate(_ok(results, ("normalize", case))):
        values, mask = data[rank]
        assert a.dtype == torch.float64
        assert_ref(a, expected[rank], torch.float64, what=f"{case} rank {rank}")
        assert_zero_outside(a, mask)
        assert int(stats["count"]) == rstats.count, f"{case} rank {rank} count"
        assert bool(stats["zero_variance"]) == rstats.zero_variance
        assert float(stats["mean"]) == pytest.approx(rstats.mean, rel=1e-12, abs=1e-12)
        assert float(stats["var"]) == pytest.approx(rstats.var, rel=1e-10, abs=1e-14)
        assert float(stats["normalized_mean"]) == pytest.approx(rstats.normalized_mean,
                                                                abs=1e-9)
        assert float(stats["normalized_std"]) == pytest.approx(rstats.normalized_std, abs=1e-9)
        if case in ("single_token", "zero_var"):
            assert float(a.abs().max()) <= 1e-6 and bool(stats["zero_variance"])


def test_normalize_distributed_equals_single_process_concatenation(results):
    # Same population through the production code in one process (shapes padded to one T).
    data = [dc.normalize_data("mixed", rank) for rank in range(dc.WORLD)]
    T = max(v.shape[1] for v, _ in data)
    vals = torch.cat([torch.nn.functional.pad(v, (0, T - v.shape[1])) for v, _ in data])
    mask = torch.cat([torch.nn.functional.pad(m, (0, T - m.shape[1])) for _, m in data])
    single, sstats = alg.masked_population_normalize(vals, mask)
    dist = _ok(results, ("normalize", "mixed"))
    offset = 0
    for a, stats in dist:
        B, Tr = a.shape
        torch.testing.assert_close(a, single[offset:offset + B, :Tr], rtol=1e-12, atol=1e-12)
        offset += B
        assert int(stats["count"]) == int(sstats.count)


@pytest.mark.parametrize("case", dc.WHITEN_CASES)
def test_whiten_equals_concatenated_reference(results, case):
    data = [dc.normalize_data(case, rank) for rank in range(dc.WORLD)]
    expected = ref.whiten([v for v, _ in data], [m for _, m in data])
    for rank, a in enumerate(_ok(results, ("whiten", case))):
        assert_ref(a, expected[rank], torch.float64, what=f"whiten {case} rank {rank}")
        assert_zero_outside(a, data[rank][1])


def test_empty_global_mask_raises_on_both_ranks(results):
    for rank, res in enumerate(results):
        r = res[("normalize", "empty")]
        assert r[0] == "err" and r[1] == "RuntimeError", f"rank {rank}: {r}"
        assert res["alive"] == float(dc.WORLD)  # neither rank hung or left the group


@pytest.mark.parametrize("name", list(dc.DISPATCH_CASES))
def test_dispatcher_distributed_equals_single_process(results, name):
    kw, rank1_empty = dc.DISPATCH_CASES[name]
    shards = [dc.dispatch_data(rank, rank1_empty) for rank in range(dc.WORLD)]
    cat = {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
    single = alg.compute_advantages_and_returns(
        advantage_section(**kw), cat["rewards"], cat["mask"],
        group_index=cat["group_index"], old_log_probs=cat["old_log_probs"],
        ref_log_probs=cat["ref_log_probs"])
    rkw = {k: v for k, v in kw.items() if k != "estimator"}
    clean = {k: torch.where(cat["mask"], cat[k], torch.zeros(())) for k in
             ("old_log_probs", "ref_log_probs")}
    radv, rret, rmetrics = ref.advantages_and_returns(
        kw["estimator"], cat["rewards"], cat["mask"], group_index=cat["group_index"], **clean,
        **rkw)
    B = dc.DISPATCH_B
    for rank, (adv, ret, metrics) in enumerate(_ok(results, ("dispatch", name))):
        sl = slice(rank * B, (rank + 1) * B)
        torch.testing.assert_close(adv, single.advantages[sl], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ret, single.returns[sl], rtol=1e-5, atol=1e-5)
        assert_ref(adv, radv[sl], torch.float32, what=f"{name} rank {rank} advantages")
        assert_ref(ret, rret[sl], torch.float32, what=f"{name} rank {rank} returns")
        assert set(metrics) == set(rmetrics)
        for key, want in rmetrics.items():
            got = float(metrics[key])
            assert got == pytest.approx(float(single.metrics[key]), rel=1e-5, abs=1e-6), \
                f"{name} rank {rank} {key}: distributed {got}, single {float(single.metrics[key])}"
            assert got == pytest.approx(want, rel=2e-5, abs=2e-6), \
                f"{name} rank {rank} {key}: {got}, reference {want}"


@pytest.mark.parametrize("kind", dc.TOKEN_LOSSES)
def test_token_mean_loss_across_ranks_equals_the_concatenated_batch(results, kind):
    """§5a, §5b: each rank divides by the global token count, so the ranks' losses add up to
    the whole batch's token mean and each rank's gradient is its slice of the whole gradient
    (``-w A / N`` for cispo, ``-A / N`` for rloo, float64 reference)."""
    data = [dc.loss_data(rank) for rank in range(dc.WORLD)]
    masks = [d["mask"] for d in data]
    n = sum(int(m.sum()) for m in masks)
    total, pgs, grads = 0.0, [], []
    for d in data:
        if kind == "cispo":
            pg, w, _ = ref.cispo_loss(d["log_probs"], d["old"], d["advantages"], d["mask"],
                                      **dc.CISPO_CLIP)
        else:
            pg = ref.rloo_loss(d["log_probs"], d["advantages"], d["mask"])
            w = np.where(d["mask"].numpy(), 1.0, 0.0)
        pgs.append(pg)
        grads.append(np.where(d["mask"].numpy(), -w * ref.f64(d["advantages"]) / n, 0.0))
    want = ref.masked_token_mean_global(pgs, masks)
    for rank, (loss, grad, count) in enumerate(_ok(results, ("token_loss", kind))):
        assert count == n
        total += float(loss)
        assert_ref(grad, grads[rank], torch.float64, what=f"{kind} rank {rank} gradient")
        assert_zero_outside(grad, masks[rank])
    assert total == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert float(np.abs(grads[1]).max()) > 0  # rank 1 trains on its own tokens


# ------------------------------------------------------------ run_distributed itself


def _rank1_raises():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise KeyError("boom on rank 1")
    return "fine"


def test_run_distributed_propagates_errors():
    # (Returning values is exercised by the ``results`` fixture above.)
    with pytest.raises(DistributedTestError, match="boom on rank 1"):
        run_distributed(_rank1_raises, 2, timeout=60)


def _rank1_hangs():
    import threading

    import torch.distributed as dist

    if dist.get_rank() == 1:
        threading.Event().wait()  # never set: a hang that no collective timeout can end
    return "done"


def test_run_distributed_fails_on_hang():
    with pytest.raises(DistributedTestError, match="rank 1: no result"):
        run_distributed(_rank1_hangs, 2, timeout=5)


def test_reference_sanity_concatenation_is_a_set():
    # The reference population ignores how tokens are split across ranks.
    data = [dc.normalize_data("mixed", rank) for rank in range(dc.WORLD)]
    a, s1 = ref.population_normalize([v for v, _ in data], [m for _, m in data])
    b, s2 = ref.population_normalize(list(reversed([v for v, _ in data])),
                                     list(reversed([m for _, m in data])))
    assert s1.count == s2.count and s1.mean == pytest.approx(s2.mean)
    np.testing.assert_allclose(a[0], b[1])
