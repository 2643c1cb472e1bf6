"""PPO's critic math against float64 references written here (reinforce_plus_plus.md §5c):
GAE by a hand-written recursion over the valid tokens (holes skipped), a tiny worked example,
the clipped value loss on both sides of the clip, explained variance, and two Gloo ranks
equal to one."""

import math

import pytest
import torch

from relax.algorithms import compute_advantages_and_returns
from relax.algorithms.value import (
    clipped_value_loss,
    gae_advantages,
    gae_returns,
    terminal_rewards,
    value_statistics,
)
from relax.config.sections import AlgorithmSection
from tests.algorithms import value_dist_worker as w
from tests.distributed_utils import run_distributed


def _ref_gae(rewards, values, mask, gamma, lambd):
    """Per row: list the valid positions, run the textbook recursion over them only."""
    out = [[0.0] * len(mask[0]) for _ in mask]
    for i, row in enumerate(mask):
        pos = [t for t, m in enumerate(row) if m]
        adv_next, v_next = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[i][t] + gamma * v_next - values[i][t]
            adv_next = delta + gamma * lambd * adv_next
            v_next = values[i][t]
            out[i][t] = adv_next
    return torch.tensor(out, dtype=torch.float64)


def test_tiny_worked_example_by_hand():
    # one row, 3 tokens, reward 1 at the end, V = (0.5, 0.25, 1.0), gamma 0.5, lambda 0.5:
    # delta_2 = 1 - 1 = 0;            A_2 = 0
    # delta_1 = 0 + 0.5*1 - 0.25 = 0.25;  A_1 = 0.25 + 0.25*0 = 0.25
    # delta_0 = 0 + 0.5*0.25 - 0.5 = -0.375; A_0 = -0.375 + 0.25*0.25 = -0.3125
    mask = torch.tensor([[True, True, True, False]])
    r = terminal_rewards(torch.tensor([1.0], dtype=torch.float64), mask)
    v = torch.tensor([[0.5, 0.25, 1.0, 7.0]], dtype=torch.float64)
    adv = gae_advantages(r, v, mask, gamma=0.5, lambd=0.5)
    assert adv.tolist() == [[-0.3125, 0.25, 0.0, 0.0]]
    assert gae_returns(adv, v, mask).tolist() == [[0.1875, 0.5, 1.0, 0.0]]


@pytest.mark.parametrize("gamma,lambd", [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0), (0.0, 0.7)])
def test_gae_with_holes_matches_the_recursion(gamma, lambd):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 9
    mask = torch.rand(B, T, generator=g) > 0.35
    mask[0] = False  # an empty row
    mask[1, 2:6] = False  # a hole (environment tokens) inside a turn-taking row
    mask[1, [0, 1, 6, 7]] = True
    rewards = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    values = torch.where(mask, values, float("nan"))  # never read at a hole
    ref = _ref_gae(rewards.tolist(), values.nan_to_num(0.0).tolist(), mask.tolist(), gamma, lambd)
    got = gae_advantages(rewards, values, mask, gamma=gamma, lambd=lambd)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    assert (got[~mask] == 0).all()


def test_gamma_and_lambda_one_give_return_minus_value():
    mask = torch.tensor([[True, True, False, True, False]])
    v = torch.tensor([[0.1, -0.2, 5.0, 0.3, 9.0]], dtype=torch.float64)
    r = terminal_rewards(torch.tensor([2.0], dtype=torch.float64), mask)
    adv = gae_advantages(r, v, mask, gamma=1.0, lambd=1.0)
    assert adv[0].tolist() == pytest.approx([2.0 - 0.1, 2.0 + 0.2, 0.0, 2.0 - 0.3, 0.0])


def test_float32_inputs_give_float32_and_outside_mask_is_zero():
    mask = torch.tensor([[True, False, True]])
    adv = gae_advantages(torch.zeros(1, 3), torch.ones(1, 3), mask, gamma=0.9, lambd=0.9)
    assert adv.dtype == torch.float32 and adv[0, 1] == 0


@pytest.mark.parametrize("name,kw", [("gamma", dict(gamma=1.5, lambd=1.0)),
                                     ("lambd", dict(gamma=1.0, lambd=-0.1))])
def test_out_of_range_discounts_are_refused(name, kw):
    with pytest.raises(ValueError, match=name):
        gae_advantages(torch.zeros(1, 2), torch.zeros(1, 2), torch.ones(1, 2, dtype=torch.bool),
                       **kw)


def _ref_value_loss(v, old, ret, c):
    clipped_v = old + max(-c, min(c, v - old))
    a, b = (v - ret) ** 2, (clipped_v - ret) ** 2
    return 0.5 * max(a, b), b > a


@pytest.mark.parametrize("v,old,ret,wins", [
    (1.0, 0.0, 2.0, True),     # above the clip, toward the target: the clipped error wins
    (1.0, 0.0, 0.0, False),    # above the clip, past the target: the unclipped error wins
    (-1.0, 0.0, -3.0, True),   # below the clip, toward the target: the clipped error wins
    (-1.0, 0.0, 0.5, False),   # below the clip, away from the target
    (0.1, 0.0, 1.0, False),    # inside the clip: both equal, nothing clipped
])
def test_clipped_value_loss_on_both_sides(v, old, ret, wins):
    c = 0.2
    mask = torch.tensor([[True, False]])
    vt = torch.tensor([[v, 3.0]], dtype=torch.float64, requires_grad=True)
    loss, clipped = clipped_value_loss(vt, torch.tensor([[old, 0.0]], dtype=torch.float64),
                                       torch.tensor([[ret, 0.0]], dtype=torch.float64), mask,
                                       value_clip=c)
    ref, ref_clipped = _ref_value_loss(v, old, ret, c)
    assert ref_clipped is wins  # the case is the one its comment names
    assert loss[0, 0].item() == pytest.approx(ref, rel=1e-12)
    assert bool(clipped[0, 0]) is ref_clipped and loss[0, 1] == 0 and not clipped[0, 1]
    loss.sum().backward()
    # the gradient flows through V in the unclipped term, not at all when the clipped term wins
    # with V outside the clip range (the clamp is flat there)
    expected = 0.0 if ref_clipped else (v - ret)
    assert vt.grad[0, 0].item() == pytest.approx(expected, abs=1e-12)
    assert vt.grad[0, 1] == 0


def test_no_clip_is_half_the_squared_error_and_negative_clip_is_refused():
    mask = torch.ones(1, 2, dtype=torch.bool)
    v = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    loss, clipped = clipped_value_loss(v, v * 0, torch.zeros_like(v), mask, value_clip=None)
    assert loss.tolist() == [[0.5, 2.0]] and not clipped.any()
    with pytest.raises(ValueError, match="value_clip"):
        clipped_value_loss(v, v, v, mask, value_clip=-0.1)


def _ref_ev(values, returns, mask):
    pairs = [(v, r) for rv, rr, rm in zip(values, returns, mask, strict=True)
             for v, r, m in zip(rv, rr, rm, strict=True) if m]
    n = len(pairs)
    mr = sum(r for _, r in pairs) / n
    me = sum(r - v for v, r in pairs) / n
    var_r = sum((r - mr) ** 2 for _, r in pairs) / n
    var_e = sum((r - v - me) ** 2 for v, r in pairs) / n
    return 1 - var_e / var_r, sum(v for v, _ in pairs) / n


def test_explained_variance_matches_the_definition():
    values, returns, mask = w.rank_data(0)
    out = value_statistics(values, returns, mask)
    ev, vm = _ref_ev(values.tolist(), returns.tolist(), mask.tolist())
    assert float(out["critic/explained_variance"]) == pytest.approx(ev, rel=1e-10)
    assert float(out["critic/values_mean"]) == pytest.approx(vm, rel=1e-10)
    perfect = value_statistics(returns, returns, mask)
    assert float(perfect["critic/explained_variance"]) == pytest.approx(1.0)
    const = value_statistics(values, torch.ones_like(values), mask)
    assert float(const["critic/explained_variance"]) == 0.0


def test_the_dispatcher_runs_gae_and_whitens_on_request():
    mask = torch.tensor([[True, True, True], [True, True, False]])
    rewards = torch.tensor([1.0, 0.0], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.6], [0.1, 0.3, 0.0]], dtype=torch.float64)
    s = AlgorithmSection(advantage_estimator="ppo", gamma=0.9, lambd=0.8)
    out = compute_advantages_and_returns(s, rewards, mask, values=values)
    ref = _ref_gae(terminal_rewards(rewards, mask).tolist(), values.tolist(), mask.tolist(),
                   0.9, 0.8)
    torch.testing.assert_close(out.advantages, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.returns, ref, rtol=1e-12, atol=1e-12)
    white = compute_advantages_and_returns(
        AlgorithmSection(advantage_estimator="ppo", gamma=0.9, lambd=0.8,
                         normalize_advantages=True),
        rewards, mask, values=values).advantages
    assert float(white[mask].mean()) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="values"):
        compute_advantages_and_returns(s, rewards, mask)


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_two_gloo_ranks_equal_the_concatenated_population():
    results = run_distributed(w.worker, w.WORLD, timeout=90)
    values, returns, mask = [], [], []
    for rank in range(w.WORLD):
        v, r, m = w.rank_data(rank)
        T = 6
        pad = T - v.shape[1]
        values += [row + [0.0] * pad for row in v.nan_to_num(0.0).tolist()]
        returns += [row + [0.0] * pad for row in r.nan_to_num(0.0).tolist()]
        mask += [row + [False] * pad for row in m.tolist()]
    ev, vm = _ref_ev(values, returns, mask)
    for rank, res in enumerate(results):
        assert res["critic/explained_variance"] == pytest.approx(ev, rel=1e-10), rank
        assert res["critic/values_mean"] == pytest.approx(vm, rel=1e-10), rank
        assert math.isfinite(res["critic/explained_variance"])
