"""Per-rank data and the worker of the two-process Gloo test of the critic's statistics
(reinforce_plus_plus.md §5c). Kept out of ``test_*.py`` so spawned children import only this
module, torch and relax; every rank's data is a pure function of the rank."""

from __future__ import annotations

import torch

WORLD = 2


def rank_data(rank: int):
    """(values [B, T], returns [B, T], mask [B, T]) float64 with NaN at masked positions."""
    g = torch.Generator().manual_seed(200 + rank)
    B, T = (3, 5) if rank == 0 else (2, 6)
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    returns = torch.randn(B, T, generator=g, dtype=torch.float64) * 2 + 0.5
    mask = torch.rand(B, T, generator=g) > 0.3
    return (torch.where(mask, values, float("nan")), torch.where(mask, returns, float("nan")),
            mask)


def worker():
    import torch.distributed as dist

    from relax.algorithms.value import value_statistics

    values, returns, mask = rank_data(dist.get_rank())
    out = value_statistics(values, returns, mask, group=dist.group.WORLD)
    return {k: float(v) for k, v in out.items()}
