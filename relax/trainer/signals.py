"""SIGTERM / SIGINT handling for ``relax train`` (docs/reliability.md, section 3).

The first signal only sets a flag: the loop finishes the rollout step in progress, all ranks
agree on stopping at the same step (one MAX all-reduce per step), the run checkpoints with
``--save`` and exits with status 128 + the signal number and one line saying where the
checkpoint is. A second signal raises at once (the last complete checkpoint stays the
newest), and so does the first one while start-up waits on user code
(:meth:`StopRequest.at_once`: building the ``--env`` environments, whose factory may take up
to its deadline). After such a stop the process ends by ``os._exit`` once its line is written
(relax/trainer/launch.py): threads still at work -- a reward server's requests in flight,
user code abandoned past its deadline -- would otherwise hold up the interpreter's exit.

The second signal must stop the run even when user code is what the main thread runs: an
environment or plug-in may catch the :class:`Interrupted` the handler raises (``except
Exception``), or block in C code that never returns to the interpreter, where no Python
handler runs. So the signals are also counted by a watchdog thread that reads them from the
interpreter's wakeup file descriptor (written by the C-level handler, whatever the main thread
does): ``GRACE_S`` seconds after the second one, if the run has not ended by then, it writes
the error line and ends the process with ``os._exit(128 + signal)``. Not covered: C code that
holds the GIL forever (no thread runs); only SIGKILL stops that.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading

from relax.errors import Interrupted

GRACE_S = 5.0  # after the second signal: the run unwinds (closes agents, files) or is ended


class StopRequest:
    """SIGTERM / SIGINT: the first one asks the loop to stop after the current rollout step
    (and save with ``--save``); a second one stops at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, grace_s: float = GRACE_S):
        self.signum: int | None = None
        self.grace_s = grace_s
        self._previous = {}
        self._watchdog: _Watchdog | None = None
        self._starting: str | None = None  # what start-up is waiting on (at_once)

    @contextlib.contextmanager
    def at_once(self, what: str):
        """While ``what`` runs (user code at start-up: nothing trained, nothing to save), the
        first signal stops the run at once instead of after a rollout step (one that came
        before it stops it on entry)."""
        if self.signum is not None:
            raise _starting_stop(self.signum, what)
        self._starting = what
        try:
            yield
        finally:
            self._starting = None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        self._watchdog = _Watchdog(self.SIGNALS, self.grace_s)

    def restore(self) -> None:
        if self._watchdog is not None:
            self._watchdog.close()  # the run ended in time: no forced exit
            self._watchdog = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            raise Interrupted(signum, _second_signal_message(name), at_once=True)
        self.signum = signum
        if self._starting is not None:
            raise _starting_stop(signum, self._starting)
        # os.write: print() inside a handler can hit a reentrant buffered-stream error
        os.write(2, f"relax train: received {name}: finishing the current rollout step, then "
                 "stopping (send it again to stop at once)\n".encode())


def _starting_stop(signum: int, what: str) -> Interrupted:
    name = signal.Signals(signum).name
    return Interrupted(signum, f"stopped by {name} while {what}, before the first rollout step "
                       "(nothing to save)", at_once=True)


def _second_signal_message(name: str) -> str:
    return (f"stopped at once by a second {name}; the newest checkpoint (if any) is the last "
            "complete one")


class _Watchdog:
    """Counts ``signals`` from the wakeup fd on a daemon thread; after the second, waits
    ``grace_s`` for :meth:`close` and otherwise ends the process."""

    def __init__(self, signals, grace_s: float):
        self.signals, self.grace_s = set(int(s) for s in signals), grace_s
        self.closed = threading.Event()
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # the C handler must never block on it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, daemon=True, name="relax-stop-watchdog").start()

    def _watch(self) -> None:
        seen = 0
        while True:
            data = os.read(self.read_fd, 64)  # blocks; the C handler writes a byte a signal
            if not data:  # close() closed the write end: done (this thread owns the read end)
                os.close(self.read_fd)
                return
            for signum in data:
                if signum in self.signals:
                    seen += 1
                    if seen == 2:
                        self._end_unless_closed(signum)

    def _end_unless_closed(self, signum: int) -> None:
        if self.closed.wait(self.grace_s):
            return
        name = signal.Signals(signum).name
        os.write(2, f"relax train: error: {_second_signal_message(name)} (user code did not "
                 f"return within {self.grace_s:g} s)\n".encode())
        os._exit(128 + signum)

    def close(self) -> None:
        self.closed.set()
        signal.set_wakeup_fd(self.previous_fd)
        os.close(self.write_fd)
