"""The one "all-reduce if there is a process group" helper, and the agreement that turns one
rank's failure into every rank's.

Below every package that talks to peers (algorithms, metrics, eval, rollout, trainer), so each
is written once. Seeds: relax/seeding.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.errors import RelaxError


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce ``tensor`` in place over ``group`` (``None``: one process, unchanged); returns it."""
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def raise_together(error: Exception | None, ctx) -> None:
    """Raise on every rank when any rank failed, so none waits forever in a collective.

    ``ctx``: anything with ``group`` and ``device`` (relax/trainer/distributed.py DistContext).
    A rank-local failure (a reward function raising on this rank's samples) would otherwise
    leave the other ranks blocked in their next all-reduce. One small MAX all-reduce per call.
    """
    if ctx.group is not None:
        flag = torch.tensor([0 if error is None else 1], device=ctx.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctx.group)
        if error is None and flag.item():
            raise RelaxError("another data-parallel rank failed; see its message")
    if error is not None:
        raise error
