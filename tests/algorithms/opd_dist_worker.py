"""Per-rank data and the worker of the two-process Gloo test of the distillation metrics
(reinforce_plus_plus.md §7b). Kept out of ``test_*.py`` so spawned children import only this
module, torch and relax; every rank's data is a pure function of the rank."""

from __future__ import annotations

import torch

WORLD = 2


def rank_data(rank: int):
    """(student [B, T], teacher [B, T], mask [B, T]) float64; rank 1 has no valid token and NaN
    at every masked position."""
    g = torch.Generator().manual_seed(100 + rank)
    B, T = (3, 5) if rank == 0 else (2, 4)
    student = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    teacher = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    mask = torch.rand(B, T, generator=g) > 0.4 if rank == 0 else torch.zeros(B, T, dtype=torch.bool)
    student = torch.where(mask, student, float("nan"))
    teacher = torch.where(mask, teacher, float("-inf"))
    return student, teacher, mask


def worker():
    import torch.distributed as dist

    from relax.algorithms.distillation import opd_metrics

    student, teacher, mask = rank_data(dist.get_rank())
    out = opd_metrics(student, teacher, mask, group=dist.group.WORLD)
    return {k: float(v) for k, v in out.items()}
