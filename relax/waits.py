"""Waits the main thread does on other threads, in slices so that signals are not held up.

A SIGTERM / SIGINT sent to the process may be delivered by the kernel to any of its threads.
CPython's C-level handler then only marks the Python handler as pending for the main thread,
which runs it the next time it executes Python code. A main thread blocked in one long lock
wait (``Event.wait()``, ``Future.result()``) is woken by a signal delivered to itself, not by
one delivered to a worker thread, so the stop (relax/trainer/signals.py) would wait until the
worker's call returned: a first signal's "finish this step" notice came late, and two signals
during one long reward call merged into one. Waiting in slices of :data:`SLICE_S` returns to
the interpreter often enough that the handler runs within a slice wherever the signal landed.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time

SLICE_S = 0.05  # the longest a pending signal handler waits on a blocked main thread


def wait_event(event: threading.Event, timeout: float | None = None) -> bool:
    """``event.wait(timeout)`` (True once set, False after ``timeout`` seconds), in slices."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = SLICE_S if deadline is None else min(SLICE_S, deadline - time.monotonic())
        if left <= 0:
            return event.is_set()
        if event.wait(left):
            return True


def future_result(future: concurrent.futures.Future):
    """``future.result()`` (its value, or what it raised), waited for in slices."""
    while True:
        try:
            return future.result(timeout=SLICE_S)
        except concurrent.futures.TimeoutError:
            if future.done():  # the call itself raised TimeoutError (a subclass since 3.11)
                return future.result()
