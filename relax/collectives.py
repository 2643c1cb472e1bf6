"""The one "all-reduce if there is a process group" helper.

Below every package that talks to peers (algorithms, metrics, eval, trainer), so it is written
once. ``seed_for`` lives in relax/seeding.py; it is re-exported here only for the trainer
modules that still import it from this place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from relax.seeding import seed_for  # noqa: F401  (re-export, see the docstring)


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce ``tensor`` in place over ``group`` (``None``: one process, unchanged); returns it."""
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor
