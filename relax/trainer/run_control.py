"""How a run ends, decided the same way on every rank (docs/reliability.md).

A run ends in one of four ways: it finishes its rollout steps; a SIGTERM/SIGINT arrives
(relax/trainer/signals.py: the step in progress completes, the run checkpoints with ``--save``
and exits with 128 + the signal number); ``--exit-duration-in-mins`` passes (the step in
progress ends the run as if it were the last: evaluated and saved, exit 0); or a failure
raises (relax/trainer/launch.py turns it into one line and an exit status).

After every step the ranks agree on the first two with one MAX all-reduce of
``[signal number, out of time]``, so all of them stop after the same step.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from relax.collectives import all_reduce
from relax.errors import Interrupted
from relax.trainer.signals import StopRequest


@dataclass(frozen=True)
class StepEnd:
    """What follows a step, agreed by the ranks: ``last`` (no step follows: the final save),
    ``cut_short`` (the budget made it the last: evaluate whatever the interval) and ``signum``
    (a stop request: checkpoint, then raise :class:`Interrupted`)."""

    last: bool
    cut_short: bool = False
    signum: int | None = None


class RunControl:
    """``after_step(done)`` after each step; ``interrupt(...)`` for a signal stop."""

    def __init__(self, ctx, stop: StopRequest, *, total_steps: int,
                 exit_duration_in_mins: float | None, started: float | None = None):
        self.ctx, self.stop, self.total_steps = ctx, stop, total_steps
        self.limit_s = None if exit_duration_in_mins is None else 60.0 * exit_duration_in_mins
        self.minutes = exit_duration_in_mins
        self.started = time.monotonic() if started is None else started
        self.ended_early: str | None = None  # the budget's message once it ended the run

    def after_step(self, done: int) -> StepEnd:
        """After ``done`` steps, one agreement collective: any rank's signal, any rank's clock
        past the budget. Neither matters after the run's last step. A signal that arrives
        after this point of a step (during evaluation or logging) is acted on after the next
        step."""
        if done >= self.total_steps:
            return StepEnd(last=True)
        late = self.limit_s is not None and time.monotonic() - self.started >= self.limit_s
        flags = torch.tensor([float(self.stop.signum or 0), float(late)], device=self.ctx.device)
        signum, late = all_reduce(flags, self.ctx.group, dist.ReduceOp.MAX).tolist()
        if signum and self.stop.signum is None:
            self.stop.signum = int(signum)  # a peer's signal stops this rank too
        if late:  # the budget wins: the run ends complete and resumable, exit 0
            self.ended_early = (f"stopped by --exit-duration-in-mins {self.minutes:g} after "
                                f"rollout step {done} of {self.total_steps}")
            return StepEnd(last=True, cut_short=True)
        return StepEnd(last=False, signum=int(signum) or None)

    def signal_before_start(self) -> int | None:
        """A signal that arrived while the run was being set up (agreed by the ranks)."""
        flags = torch.tensor([float(self.stop.signum or 0)], device=self.ctx.device)
        signum = int(all_reduce(flags, self.ctx.group, dist.ReduceOp.MAX).item())
        if signum and self.stop.signum is None:
            self.stop.signum = signum
        return signum or None

    def interrupt(self, signum: int, step: int, where: str) -> None:
        """Raise the signal stop after ``step`` (``where``: the checkpoint line)."""
        raise Interrupted(signum, f"stopped by {signal.Signals(signum).name} after rollout step "
                          f"{step} of {self.total_steps}{where}")
