"""How the collectors of one rollout step agree: the data-parallel shares of a step reduce a
small tensor together ("is any share short?", "the fewest kept", "how many fresh prompts
each") and fail together, whichever processes play them.

    agree.reduce(tensor, op)      tensor [k] reduced over every share of the step, in place
    agree.raise_together(error)   every share raises when any share failed

Colocated (:class:`GroupAgreement`), each data-parallel rank plays its own share and the
reduction is one all-reduce over the training ranks' group. On the rollout ranks of
``--fully-async`` one process may play several training ranks' shares (AsyncLayout.shares):
:class:`Lockstep` runs them on one thread each, and each agreement is reduced over the
shares of this process, then all-reduced over the serving rollout ranks' own group. The
shares take turns (one holds the turn until its next agreement), so shares of a process never
compute at once: the judge, the sampler and the model are used as by one rank, and nothing
depends on which thread ran first. A share that fails breaks the barrier, so the others stop
at their next agreement instead of waiting; a barrier wait is bounded by
``--distributed-timeout-minutes``, like the all-reduce it stands for.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from relax.collectives import all_reduce
from relax.errors import PeerFailure, RelaxError
from relax.waits import future_result

ANOTHER_FAILED = "another data-parallel rank failed; see its message"


@runtime_checkable
class Agreement(Protocol):
    def reduce(self, tensor: torch.Tensor, op) -> torch.Tensor: ...
    def raise_together(self, error: Exception | None) -> None: ...


def raise_together(agree: Agreement, error: Exception | None, device) -> None:
    """Raise on every share when any share failed (one MAX reduction of a flag)."""
    flag = torch.tensor([0 if error is None else 1], device=device)
    if agree.reduce(flag, dist.ReduceOp.MAX).item() and error is None:
        raise RelaxError(ANOTHER_FAILED)
    if error is not None:
        raise error


class GroupAgreement:
    """The shares are the ranks of ``group`` (None: one process, nothing to agree)."""

    def __init__(self, group, device):
        self.group, self.device = group, device

    def reduce(self, tensor: torch.Tensor, op) -> torch.Tensor:
        return all_reduce(tensor, self.group, op)

    def raise_together(self, error: Exception | None) -> None:
        if self.group is None:  # one process: no collective at all, as before
            if error is not None:
                raise error
            return
        raise_together(self, error, self.device)


_COMBINE = {dist.ReduceOp.SUM: torch.add, dist.ReduceOp.MAX: torch.maximum,
            dist.ReduceOp.MIN: torch.minimum}


class Lockstep:
    """The shares of one process (``count`` of them) in lockstep, reduced further over
    ``group`` (the other serving rollout ranks; None: this process alone)."""

    def __init__(self, count: int, group, device, *, timeout_s: float):
        self.count, self.group, self.device, self.timeout_s = count, group, device, timeout_s
        self.slots: list = [None] * count
        self.result: torch.Tensor | None = None
        self.turn = threading.Lock()  # held by the share that computes
        # the barrier: shares arrived at this agreement, agreements completed, and whether a
        # share failed (threading.Barrier's abort would also break the agreement just
        # completed for a share not yet awake)
        self.cond = threading.Condition()
        self.arrived = self.generation = 0
        self.failed = False
        self.pool = (concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="share")
                     if count > 1 else None)

    def share(self, index: int) -> Agreement:
        """The agreement share ``index`` (0 .. count - 1) of this process uses."""
        return _Share(self, index)

    def run(self, calls: list[Callable[[], object]]) -> list:
        """``calls[i]()`` as share i, all in lockstep; their results in order. The first
        failure of a share is raised (not the other shares' "another failed")."""
        if self.pool is None:  # one share, or none (a rollout rank past the training ranks')
            return [call() for call in calls]
        threads = torch.get_num_threads()  # the intra-op threads of the process, not OpenMP's default
        futures = [self.pool.submit(self._play, call, threads) for call in calls]
        outcomes = []
        for future in futures:
            try:
                outcomes.append((future_result(future), None))
            except BaseException as e:  # noqa: BLE001 (re-raised below, the most telling first)
                outcomes.append((None, e))
        errors = [e for _, e in outcomes if e is not None]
        if errors:
            self.close()
            raise min(errors, key=_echo)
        return [value for value, _ in outcomes]

    def close(self) -> None:
        if self.pool is not None:
            self._fail()
            self.pool.shutdown(wait=False, cancel_futures=True)

    def _fail(self) -> None:
        """A share failed: the others raise at their next agreement."""
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def _play(self, call, threads: int):
        torch.set_num_threads(threads)
        with self.turn:
            try:
                return call()
            except BaseException:
                self._fail()  # the others stop at their next agreement
                raise

    def _reduce(self, index: int, tensor: torch.Tensor, op) -> torch.Tensor:
        if self.pool is None:
            return all_reduce(tensor, self.group, op)
        self.slots[index] = (tensor.clone(), op)
        self.turn.release()  # the next share computes until its own agreement
        try:
            self._wait()
        finally:
            self.turn.acquire()
        tensor.copy_(self.result)
        return tensor

    def _wait(self) -> None:
        """Until every share arrived (the last combines), or a share failed."""
        with self.cond:
            generation = self.generation
            if not self.failed:
                self.arrived += 1
                if self.arrived == self.count:
                    self._complete()
                    return
                if not self.cond.wait_for(lambda: self.generation != generation or self.failed,
                                          self.timeout_s):
                    self.failed = True
                    self.cond.notify_all()
                    raise RelaxError("a share of this rollout rank waited longer than "
                                     "--distributed-timeout-minutes for the others")
            if self.generation == generation:  # failed before this agreement completed
                raise RelaxError(ANOTHER_FAILED)

    def _complete(self) -> None:
        try:
            self._combine()
            self.generation += 1
        except BaseException:
            self.failed = True
            raise
        finally:
            self.arrived = 0
            self.cond.notify_all()

    def _combine(self) -> None:
        """Run once per agreement, by the last share to arrive."""
        ops = {op for _, op in self.slots}
        if len(ops) != 1:
            raise RuntimeError(f"the shares of a rollout rank reduced with different ops {ops}")
        (op,) = ops
        out = self.slots[0][0]
        for tensor, _ in self.slots[1:]:
            out = _COMBINE[op](out, tensor)
        try:
            self.result = all_reduce(out, self.group, op)
        except Exception as e:  # the other rollout ranks: a timeout or a closed connection
            raise PeerFailure(f"rollout ranks agreeing on a step: {type(e).__name__}: "
                              f"{' '.join(str(e).split())[:200]}") from e


class _Share:
    def __init__(self, lockstep: Lockstep, index: int):
        self.lockstep, self.index = lockstep, index

    def reduce(self, tensor: torch.Tensor, op) -> torch.Tensor:
        return self.lockstep._reduce(self.index, tensor, op)

    def raise_together(self, error: Exception | None) -> None:
        lockstep = self.lockstep
        if lockstep.group is None and lockstep.pool is None:
            if error is not None:
                raise error
            return
        raise_together(self, error, lockstep.device)


def _echo(error: BaseException) -> int:
    """Sort key: a share's own failure before the ones that only echo it."""
    return 1 if isinstance(error, RelaxError) and str(error).startswith(ANOTHER_FAILED) else 0
