"""Run a function in N real spawned processes joined by a Gloo process group (127.0.0.1).

    from tests.distributed_utils import run_distributed
    results = run_distributed(fn, 2, arg1, arg2, timeout=60)   # [rank0_value, rank1_value]

``fn`` must be importable by name (a module-level function in a module the child can
import; keep such workers outside ``test_*.py`` files so the children stay light). It runs
as ``fn(*args)`` after ``torch.distributed.init_process_group("gloo")``, so it reads its
rank with ``dist.get_rank()`` and may use ``dist.group.WORLD``. Its return value must be
picklable (tensors are fine); it is sent back as plain pickle bytes so no shared-memory
handle outlives the child.

The ranks meet at a ``TCPStore`` that this process opens on a port the OS picks and holds
until they are done, never at a port chosen, released and handed on: another process (a
parallel test, an outgoing connection) may take such a port in between, and rank 0 then
fails to bind it or its peers meet a stranger. No rank runs ``fn`` before every rank's
process group is up (a rank that returned at once closed its connections under a peer still
connecting: "Connection closed by peer" in Gloo's init). torchrun launches use
``--standalone`` for the same reason: its agent hosts the rendezvous on a port of its own.
Where a child must be told a port up front (two torchrun agents with ``--node_rank``, ranks
started without torchrun), the port stays reserved for the run (relax/ports.py).

A rank that raises makes ``run_distributed`` raise ``DistributedTestError`` carrying every
rank's traceback; a rank that does not report within ``timeout`` seconds (a hang, a
deadlocked collective) is killed and reported the same way, so a hang fails the test
instead of stalling the suite.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any


class DistributedTestError(AssertionError):
    """A rank raised, died or hung; the message holds each failing rank's report."""


def rendezvous_store(timeout: float = 300.0):
    """A ``TCPStore`` server on 127.0.0.1 at a port the OS picks (``.port``), for ranks that
    join it as clients; it listens for as long as the returned object lives."""
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                    timeout=datetime.timedelta(seconds=timeout))


# One node: the agent hosts the rendezvous and the ranks' store on ports it binds itself
# (``--standalone``: c10d rendezvous at localhost:0), on 127.0.0.1 (``--local-addr``).
TORCHRUN_FLAGS = ["--standalone", "--local-addr", "127.0.0.1"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", *TORCHRUN_FLAGS]


def torchrun_relax(*flags: str, timeout: float = 180, nproc: int = 2,
                   hang: str = "torchrun did not finish",
                   fresh: bool = False) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node NPROC -m relax train FLAGS`` on 127.0.0.1, one intra-op
    thread per rank (the ranks share the CI machine's cores). A run past ``timeout`` seconds fails
    the test with ``hang`` and the ranks' stderr: a hang is a failure, never a stalled suite.

    ``nproc=1`` runs ``python -m relax train FLAGS`` itself: a world of one joins no process
    group (relax/trainer/distributed.py ``init_distributed``), so under torchrun it ran the
    same code, after ~2 s of CPU for torchrun's agent and rendezvous.

    The command is forked from this worker's preloaded process (tests/preloaded.py): torchrun's
    own agent, its ranks started by fork, without ~4 s of imports per rank. ``fresh``: fresh
    processes instead, as a user's shell starts them (``python -m torch.distributed.run``, each
    rank ``python -u -m relax``), for the tests of the launch itself."""
    import pytest

    from tests import preloaded

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    nodes = ["--nproc_per_node", str(nproc)]
    try:
        if not fresh:
            return preloaded.run(["train", *flags], env=env, base_env=dict(os.environ),
                                 cwd=None, timeout=timeout,
                                 torchrun=[*TORCHRUN_FLAGS, *nodes] if nproc > 1 else None)
        launch = [*TORCHRUN, *nodes] if nproc > 1 else [sys.executable]
        return subprocess.run([*launch, "-m", "relax", "train", *flags], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{hang} within {timeout:g} s (hang?):\n{e.stderr}")


def _child(fn: Callable, rank: int, world_size: int, port: int, args: tuple,
           results: Any, pg_timeout: float) -> None:
    # Set before importing torch so a 2-core box is not oversubscribed by N ranks.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        timeout = datetime.timedelta(seconds=pg_timeout)
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=timeout)
        # No rank goes on before every rank's Gloo mesh is up: a rank whose fn returns at
        # once closes its connections on destroy_process_group, and a peer still inside
        # init_process_group then fails with "Connection closed by peer" (seen in two
        # parallel runs of test_run_distributed_propagates_errors, the store already held).
        store.set(f"joined/{rank}", "1")
        store.wait([f"joined/{r}" for r in range(world_size)], timeout)
        try:
            value = fn(*args)
            payload = (rank, True, pickle.dumps(value))
        finally:
            try:
                dist.destroy_process_group()
            except Exception:  # a broken group must not hide fn's own result
                pass
    except BaseException:  # noqa: BLE001 - report everything, the parent decides
        payload = (rank, False, traceback.format_exc())
    results.put(payload)


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 60.0) -> list:
    """Run ``fn(*args)`` on ``world_size`` Gloo ranks; return the per-rank values in rank order.

    Raises ``DistributedTestError`` if any rank raised, exited without reporting, or did not
    finish within ``timeout`` seconds (its processes are then killed).
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    # Collectives time out a little before the overall deadline, so a desynchronised
    # rank usually reports a traceback rather than just being killed.
    pg_timeout = max(5.0, 0.75 * timeout)
    store = rendezvous_store(timeout)  # listens until this call returns
    port = store.port
    procs = [
        ctx.Process(target=_child, args=(fn, rank, world_size, port, args, results, pg_timeout),
                    daemon=True)
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    reports: dict[int, tuple[bool, Any]] = {}
    try:
        while len(reports) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, ok, data = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                # A child killed by a signal never reports; stop waiting for it.
                if any(p.exitcode not in (None, 0) and r not in reports
                       for r, p in enumerate(procs)):
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                    for r in dead:
                        reports.setdefault(r, (False, f"exited with code {procs[r].exitcode}"))
                continue
            reports[rank] = (ok, data)
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())) + 1.0)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()

    problems = []
    for rank in range(world_size):
        if rank not in reports:
            problems.append(f"rank {rank}: no result within {timeout:.0f}s (hang); killed")
        elif not reports[rank][0]:
            problems.append(f"rank {rank} failed:\n{reports[rank][1]}")
    if problems:
        raise DistributedTestError(
            f"run_distributed({getattr(fn, '__qualname__', fn)!s}, world_size={world_size}):\n"
            + "\n".join(problems)
        )
    return [pickle.loads(reports[rank][1]) for rank in range(world_size)]
