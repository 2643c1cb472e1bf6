"""Workers of tests/test_agreement.py (spawned: outside the test module)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.agreement import GroupAgreement, Lockstep

OPS = (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN)


def rounds(agree, v: int) -> list[list[float]]:
    """Three agreements of share ``v``, the values depending on the share and the round."""
    out = []
    for r, op in enumerate(OPS):
        x = torch.tensor([float(v * 10 + r), float(-v)])
        out.append(agree.reduce(x, op).tolist())
    return out


def colocated(count: int):
    """Share v is rank v of a group of ``count`` ranks."""
    return rounds(GroupAgreement(dist.group.WORLD, torch.device("cpu")), dist.get_rank())


def two_rollout_ranks(trainers: int):
    """Rank r plays shares v with v % 2 == r, in lockstep, reducing over both ranks."""
    rank = dist.get_rank()
    shares = [v for v in range(trainers) if v % 2 == rank]
    lockstep = Lockstep(len(shares), dist.group.WORLD, torch.device("cpu"), timeout_s=30)
    try:
        got = lockstep.run([lambda i=i, v=v: rounds(lockstep.share(i), v)
                            for i, v in enumerate(shares)])
    finally:
        lockstep.close()
    return dict(zip(shares, got, strict=True))
