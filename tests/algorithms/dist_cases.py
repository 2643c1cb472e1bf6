"""Per-rank data and the worker for the two-process Gloo tests (reinforce_plus_plus.md §6, and
the global token mean of rloo and cispo, §5a, §5b).

Kept out of ``test_*.py`` so spawned children import only this module, torch and relax.
Every rank's data is a pure function of (case, rank), so the parent builds the same
tensors to form the concatenated single-process population.
"""

from __future__ import annotations

import numpy as np
import torch

WORLD = 2
NAN, INF = float("nan"), float("inf")

# Cases in the order the worker runs them; the empty global mask goes last so that an
# implementation that raises there cannot desynchronise the earlier collectives.
NORMALIZE_CASES = ("mixed", "rank1_empty", "single_token", "zero_var")
WHITEN_CASES = ("mixed", "rank1_empty")
RPP = dict(estimator="reinforce_plus_plus", normalize_advantages=True, gamma=0.99, kl_coef=0.01)
GRPO_WHITEN = dict(estimator="grpo", normalize_advantages=True)
# name -> (settings, rank 1 holds no valid token at all)
DISPATCH_CASES = {
    "rpp": (RPP, False),
    "baseline": (dict(estimator="reinforce_plus_plus_baseline", normalize_advantages=True),
                 False),
    "grpo_whiten": (GRPO_WHITEN, False),
    "grpo": (dict(estimator="grpo"), False),
    "sapo_no_std": (dict(estimator="sapo", normalize_advantages=True, std_normalization=False),
                    False),
    "cispo": (dict(estimator="cispo", normalize_advantages=True), False),
    "rloo": (dict(estimator="rloo"), False),
    "rloo_rank1_empty": (dict(estimator="rloo"), True),
    "rpp_rank1_empty": (RPP, True),
    "grpo_whiten_rank1_empty": (GRPO_WHITEN, True),
}
DISPATCH_B, DISPATCH_T, GROUP_SIZE = 6, 9, 3
# policy losses reduced by the global token mean, rank 1 with one fully masked row
TOKEN_LOSSES = ("cispo", "rloo")
CISPO_CLIP = dict(eps_clip=0.2, eps_clip_high=0.28)


def _holes_mask(rng, B, T) -> np.ndarray:
    m = np.zeros((B, T), dtype=bool)
    for i in range(B):
        n = int(rng.integers(1, T + 1))
        m[i, :n] = True
        m[i, 1:n - 1] &= rng.random(max(0, n - 2)) > 0.3
    return m


def normalize_data(case: str, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64 [B,T] with sentinels outside the mask, mask bool [B,T]) of one rank."""
    shapes = {0: (3, 7), 1: (4, 5)}  # different B and T per rank: the population is a set
    B, T = shapes[rank]
    rng = np.random.default_rng(100 * (NORMALIZE_CASES + ("empty",)).index(case) + rank)
    values = rng.normal(0.5, 1.5, size=(B, T))
    if case == "mixed":
        mask = _holes_mask(rng, B, T)
        mask[1] = False  # a fully masked row on each rank
    elif case == "rank1_empty":
        mask = _holes_mask(rng, B, T) if rank == 0 else np.zeros((B, T), dtype=bool)
    elif case == "single_token":
        mask = np.zeros((B, T), dtype=bool)
        if rank == 0:
            mask[2, 4] = True
    elif case == "zero_var":
        mask = _holes_mask(rng, B, T)
        values[:] = 0.7
    elif case == "empty":
        mask = np.zeros((B, T), dtype=bool)
    else:
        raise KeyError(case)
    sentinels = np.array([NAN, INF, -INF, 1e30])
    values = np.where(mask, values, sentinels[np.arange(B * T).reshape(B, T) % 4])
    return torch.tensor(values, dtype=torch.float64), torch.from_numpy(mask)


def dispatch_data(rank: int, rank1_empty: bool = False, dtype=torch.float32) -> dict:
    """A rollout shard of one rank; group ids are globally unique (groups never span ranks)."""
    rng = np.random.default_rng(7000 + rank)
    B, T = DISPATCH_B, DISPATCH_T
    mask = _holes_mask(rng, B, T)
    if rank == 1:
        mask[4] = False
        if rank1_empty:
            mask[:] = False
    rewards = rng.choice([0.0, 1.0], size=B) + rng.normal(0, 0.05, size=B)
    old = np.where(mask, rng.normal(-1.0, 0.5, size=(B, T)), NAN)
    refl = np.where(mask, rng.normal(-1.0, 0.5, size=(B, T)), -INF)
    group_index = torch.arange(B) // GROUP_SIZE + rank * (B // GROUP_SIZE)
    return dict(rewards=torch.tensor(rewards, dtype=dtype), mask=torch.from_numpy(mask),
                group_index=group_index, old_log_probs=torch.tensor(old, dtype=dtype),
                ref_log_probs=torch.tensor(refl, dtype=dtype))


def loss_data(rank: int) -> dict:
    """(log_probs, old, advantages float64 with sentinels outside the mask, mask) of a rank:
    ratios on both sides of both CISPO bounds, advantages of both signs."""
    rng = np.random.default_rng(8100 + rank)
    B, T = (4, 7) if rank == 0 else (5, 7)
    mask = _holes_mask(rng, B, T)
    if rank == 1:
        mask[2] = False
    old = rng.normal(-1.5, 0.6, size=(B, T))
    lp = old + rng.normal(0.0, 0.5, size=(B, T))
    adv = rng.normal(0.0, 1.0, size=(B, T))
    out = {k: torch.tensor(np.where(mask, v, NAN), dtype=torch.float64)
           for k, v in (("log_probs", lp), ("old", old), ("advantages", adv))}
    return {**out, "mask": torch.from_numpy(mask)}


def token_loss(kind: str, data: dict, group) -> tuple:
    """This rank's share of the global token mean of ``kind``'s loss and its gradient."""
    import relax.algorithms as alg
    from relax.collectives import all_reduce

    mask = data["mask"]
    count = all_reduce(mask.sum().to(torch.float64), group)
    leaf = data["log_probs"].clone().requires_grad_(True)
    if kind == "cispo":
        pg = alg.cispo_loss(leaf, data["old"], data["advantages"], mask, **CISPO_CLIP)[0]
    else:
        pg = alg.rloo_loss(leaf, data["advantages"], mask)
    loss = alg.token_mean(pg, mask, num_tokens=count)
    loss.backward()
    return loss.detach(), leaf.grad.clone(), float(count)


def _stats_dict(stats) -> dict:
    return {k: getattr(stats, k).detach().clone() for k in
            ("mean", "var", "count", "zero_variance", "normalized_mean", "normalized_std")}


def _attempt(fn):
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001 - reported to the parent test
        return ("err", type(e).__name__, str(e)[:500])


def worker() -> dict:
    """Runs every distributed case on this rank with group=WORLD; returns case -> result."""
    import torch.distributed as dist

    import relax.algorithms as alg
    from tests.algorithms.reference import advantage_section

    rank = dist.get_rank()
    group = dist.group.WORLD
    out: dict = {}
    for case in NORMALIZE_CASES:
        values, mask = normalize_data(case, rank)

        def norm(values=values, mask=mask):
            a, stats = alg.masked_population_normalize(values, mask, group=group)
            return a, _stats_dict(stats)

        out[("normalize", case)] = _attempt(norm)
    for case in WHITEN_CASES:
        values, mask = normalize_data(case, rank)
        out[("whiten", case)] = _attempt(lambda v=values, m=mask: alg.masked_whiten(v, m,
                                                                                  group=group))
    for name, (kw, rank1_empty) in DISPATCH_CASES.items():
        data = dispatch_data(rank, rank1_empty)

        def dispatch(kw=kw, data=data):
            o = alg.compute_advantages_and_returns(advantage_section(**kw), data["rewards"],
                                                   data["mask"], group_index=data["group_index"],
                                                   old_log_probs=data["old_log_probs"],
                                                   ref_log_probs=data["ref_log_probs"],
                                                   group=group)
            return o.advantages, o.returns, {k: v.clone() for k, v in o.metrics.items()}

        out[("dispatch", name)] = _attempt(dispatch)
    for kind in TOKEN_LOSSES:
        out[("token_loss", kind)] = _attempt(lambda k=kind: token_loss(k, loss_data(rank), group))
    values, mask = normalize_data("empty", rank)
    out[("normalize", "empty")] = _attempt(
        lambda: alg.masked_population_normalize(values, mask, group=group))
    # A final collective proves both ranks are still alive and in step after the error.
    t = torch.ones(1)
    dist.all_reduce(t)
    out["alive"] = float(t)
    return out
