"""The one "all-reduce if there is a process group" helper. The agreement that turns one
rank's failure into every rank's is built on it: relax/agreement.py.

Below every package that talks to peers (algorithms, metrics, eval, rollout, trainer), so each
is written once. Seeds: relax/seeding.py.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce ``tensor`` in place over ``group`` (``None``: one process, unchanged); returns it."""
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor
