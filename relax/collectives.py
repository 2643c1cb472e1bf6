"""The one "all-reduce if there is a process group" helper, and the one seed derivation.

Below every package that talks to peers or draws random streams (algorithms, metrics, eval,
trainer), so each concept is written once.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist


def all_reduce(tensor: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce ``tensor`` in place over ``group`` (``None``: one process, unchanged); returns it."""
    if group is not None:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def seed_for(*parts) -> int:
    """A 63-bit seed from (seed, rank, step, ...): independent streams without collisions."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
