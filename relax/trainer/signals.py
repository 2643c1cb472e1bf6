"""SIGTERM / SIGINT handling for ``relax train`` (docs/reliability.md, section 3).

The first signal only sets a flag: the loop finishes the rollout step in progress, all ranks
agree on stopping at the same step (one MAX all-reduce per step), the run checkpoints with
``--save`` and exits with status 128 + the signal number and one line saying where the
checkpoint is. A second signal raises at once (the last complete checkpoint stays the newest).
"""

from __future__ import annotations

import os
import signal
import threading

from relax.errors import Interrupted


class StopRequest:
    """SIGTERM / SIGINT: the first one asks the loop to stop after the current rollout step
    (and save with ``--save``); a second one stops at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self):
        self.signum: int | None = None
        self._previous = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            raise Interrupted(signum, f"stopped at once by a second {name}; the newest "
                              "checkpoint (if any) is the last complete one")
        self.signum = signum
        # os.write: print() inside a handler can hit a reentrant buffered-stream error
        os.write(2, f"relax train: received {name}: finishing the current rollout step, then "
                 "stopping (send it again to stop at once)\n".encode())
