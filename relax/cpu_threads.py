"""Intra-op threads for work on the CPU, one rule for ``relax train`` (each rank) and
``relax eval``: ``OMP_NUM_THREADS`` when the user set it, else the host's cores divided between
the local ranks (docs/performance.md measures this against one thread). On a machine shared
with other work, ``OMP_NUM_THREADS=1`` per process is steadier."""

from __future__ import annotations

import os


def cpu_threads(*, cpu_count: int | None = None, local_world_size: int = 1,
                environ=None) -> int:
    """The thread count to give ``torch.set_num_threads`` (at least 1)."""
    environ = os.environ if environ is None else environ
    if environ.get("OMP_NUM_THREADS", "").strip().isdigit():
        return max(1, int(environ["OMP_NUM_THREADS"]))
    return max(1, (cpu_count or os.cpu_count() or 1) // max(1, local_world_size))
