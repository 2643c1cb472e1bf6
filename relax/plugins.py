"""User plug-ins: loading and checking them, and calling them with a deadline. The one
boundary that reward functions (relax/rollout/reward/rewards.py, relax/rollout/reward/group_rewards.py),
``--env`` environments (relax/rollout/agents/envs.py, relax/rollout/agents/env_guard.py), the rewards of
agent programs (relax/rollout/agents/agent_procs.py) and of reward servers
(relax/rollout/reward/remote_reward.py), dynamic-sampling filters and the post-process / advantage /
TIS plug-ins share.

Loading: ``module:function`` (an importable module) or ``path/file.py:function``; anything
the module raises at import, ``SystemExit`` and ``KeyboardInterrupt`` included, a name that
is not a function, or a function that cannot take the arguments its flag passes
(:data:`ARITY`), is one :class:`~relax.errors.InputError` line naming the flag, before any model
is loaded.

Checking what comes back: :func:`bad_reward` (NaN, an infinity, beyond float32) and
:func:`real_values` (n real numbers, from a list, tuple, 1-D array or tensor), the checks
every reward source applies.

Calling: :func:`call_with_deadline` runs the function on a worker thread and waits at most
the deadline. Python cannot stop a thread, so a call that runs over is *abandoned*: it keeps
its worker until it returns. The workers are a bounded pool of daemon threads
(:data:`MAX_RUNNING`, reused), so calls that never return cannot pile up threads: once every
worker holds an abandoned call, the next call is refused at once (:class:`CallTimeout` with
``busy``), which costs no wait at all. Daemon threads never hold up the end of the process.
The caller's CUDA device is set on the worker (it is per thread), so user code that makes
tensors on "cuda" makes them where the caller would.

Without a deadline (None) the call runs on the caller's thread, as code that needs the main
thread (``signal.alarm``, as gem's math graders use) requires.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import os
import queue
import sys
import threading
from collections.abc import Callable

from relax.errors import InputError, RewardError, error_summary, stops_the_run
from relax.waits import wait_event

# Workers of the pool: one runs the call the trainer waits for, the others may hold calls
# abandoned after their deadline. Calls run one at a time, so more would only hold more
# threads (and their CPU) for code that has already failed.
MAX_RUNNING = 8


class CallTimeout(Exception):
    """The call did not return within ``timeout`` seconds (abandoned), or -- ``busy`` > 0 --
    was not started because ``busy`` earlier calls still run past their deadline."""

    def __init__(self, timeout: float, busy: int = 0):
        self.timeout, self.busy = timeout, busy
        super().__init__(self.reason())

    def reason(self) -> str:
        """``did not return within T s``, or why the call never started."""
        if self.busy:
            return (f"was not started: {self.busy} earlier calls of user code that ran past "
                    "their time limit still run (Python cannot stop them)")
        return f"did not return within {self.timeout:g} s"


class CallRaised(Exception):
    """The user code itself raised ``error`` (any ``BaseException``), as opposed to what
    happens while the caller waits: a signal handler's exception passes through unwrapped."""

    def __init__(self, error: BaseException):
        super().__init__(error_summary(error))
        self.error = error


class _Job:
    def __init__(self, fn: Callable, args: tuple, device):
        self.fn, self.args, self.device = fn, args, device
        self.done = threading.Event()
        self.value = self.error = None

    def run(self) -> None:
        try:
            if self.device is not None:
                import torch  # only when the caller had a CUDA device: torch is loaded

                torch.cuda.set_device(self.device)
            self.value = self.fn(*self.args)
        except BaseException as e:  # SystemExit would end the worker silently, no value
            self.error = e
        finally:
            self.done.set()


class DeadlinePool:
    """At most ``size`` daemon workers, started on demand and reused."""

    def __init__(self, size: int = MAX_RUNNING):
        self.size = size
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._threads = 0  # started, never more than size
        self._busy = 0  # submitted and not yet returned (the abandoned ones included)

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def busy(self) -> int:
        """Calls submitted and not yet returned (the abandoned ones included)."""
        with self._lock:
            return self._busy

    def call(self, fn: Callable, args: tuple, timeout: float | None):
        """``fn(*args)`` within ``timeout`` seconds (None: on this thread, no limit).

        Raises :class:`CallTimeout` or :class:`CallRaised`; the trainer's own stop
        (:func:`relax.errors.stops_the_run`) propagates from the wait unwrapped."""
        if timeout is None:
            try:
                return fn(*args)
            except BaseException as e:
                if stops_the_run(e):  # a second SIGTERM/SIGINT: not the user code's failure
                    raise
                raise CallRaised(e) from e
        job = _Job(fn, args, _cuda_device())
        with self._lock:
            if self._busy >= self.size:
                raise CallTimeout(timeout, busy=self._busy)
            self._busy += 1
            if self._threads < self._busy:  # every started worker holds a call
                self._threads += 1
                threading.Thread(target=self._work, daemon=True,
                                 name=f"relax-user-code-{self._threads}").start()
        self._jobs.put(job)
        if not wait_event(job.done, timeout):  # a signal's Interrupted propagates from here
            raise CallTimeout(timeout)
        if job.error is not None:
            raise CallRaised(job.error) from job.error
        return job.value

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            try:
                job.run()
            finally:
                with self._lock:
                    self._busy -= 1


_POOL = DeadlinePool()


def call_with_deadline(fn: Callable, args: tuple = (), timeout: float | None = None):
    """``fn(*args)`` on the process's pool of user-code workers (:class:`DeadlinePool`)."""
    return _POOL.call(fn, args, timeout)


def _cuda_device() -> int | None:
    torch = sys.modules.get("torch")  # never imported here: reward code may run without it
    if torch is None or not torch.cuda.is_initialized():
        return None
    return torch.cuda.current_device()


# How many positional arguments each plug-in flag's function is called with (the signatures
# docs/configuration.md gives): a function that cannot take them is refused when loaded, in
# one line naming the flag, rather than at its first call, after the model has loaded.
ARITY = {
    "--custom-rm-path": 3,  # (prompts, responses, labels), also per group with --group-rm
    "--dynamic-sampling-filter-path": 3,  # (rewards, responses, label) of one group
    "--custom-reward-post-process-path": 2,  # (rewards, group_index)
    "--custom-advantage-function-path": 3,  # (rewards, group_index, mask)
    "--custom-tis-function-path": 3,  # (trainer_logprobs, sampler_logprobs, mask)
    "--env": 0,  # the environment factory
}


def load_function(spec: str, flag: str) -> Callable:
    """Import ``module:function`` or ``path/to/file.py:function``; errors name ``flag``.

    A flag of :data:`ARITY` also checks that the function can take its arguments."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise InputError(f"{flag} {spec}: expected 'module:function' or 'file.py:function'")
    try:
        if target.endswith(".py") or os.sep in target:
            if not os.path.isfile(target):
                raise InputError(f"{flag} {spec}: file {target} does not exist")
            mod_name = "relax_user_" + os.path.splitext(os.path.basename(target))[0]
            module_spec = importlib.util.spec_from_file_location(mod_name, target)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except InputError:
        raise
    except BaseException as e:  # the user's module failing to import (even by sys.exit or
        # KeyboardInterrupt at import time) is bad input, said in one line
        if stops_the_run(e):
            raise
        detail = " ".join(str(e).split())[:200]
        raise InputError(f"{flag} {spec}: cannot import {target}: {type(e).__name__}"
                         f"{': ' + detail if detail else ''}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"{flag} {spec}: {target} has no function {name!r}")
    if flag in ARITY:
        _check_arity(fn, ARITY[flag], f"{flag} {spec}")
    return fn


def _check_arity(fn: Callable, arity: int, where: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin or C function without one: checked by calling
        return
    try:
        signature.bind(*range(arity))
    except TypeError as e:
        raise InputError(f"{where}: the function takes {signature}, but is called with "
                         f"{arity} positional argument{'s' * (arity != 1)} ({e})") from None


# Rewards become float32 tensors (relax/rollout/reward/scoring.py): a value finite in float64 but
# beyond this is Inf there, and would surface as a non-finite loss blaming --lr.
FLOAT32_MAX = 3.4028234663852886e38


def bad_reward(value: float) -> str | None:
    """Why ``value`` cannot be a reward (NaN, an infinity, beyond float32), or None."""
    if math.isfinite(value) and abs(value) <= FLOAT32_MAX:
        return None
    if math.isfinite(value):
        return f"{value:g}, beyond the float32 range of rewards (+-{FLOAT32_MAX:.3g})"
    return f"{value}"


def real_values(values, n: int, name: str, where: str) -> list[float]:
    """``values`` as n floats, or a RewardError saying what is wrong (not yet the NaN check).

    Accepted: a list or tuple of real numbers (int, float, NumPy scalars; not bool), or a 1-D
    NumPy array or torch tensor of a real dtype. A dict would iterate its keys and a str its
    characters, so anything else is refused rather than read. ``name`` names the reward
    function, ``where`` the samples.
    """
    what = f"reward function {name} must return a list of {n} real numbers"
    kind = type(values).__name__
    if type(values).__module__ == "torch" and hasattr(values, "tolist"):  # a tensor
        if values.dim() != 1 or values.dtype.is_complex or str(values.dtype) == "torch.bool":
            raise RewardError(f"{what}, got a {values.dtype} tensor of shape "
                              f"{tuple(values.shape)}")
        values = values.tolist()
    elif type(values).__module__ == "numpy" and hasattr(values, "ndim"):  # an array
        if values.ndim != 1 or values.dtype.kind not in "iuf":
            raise RewardError(f"{what}, got a {values.dtype} array of shape {values.shape}")
        values = values.tolist()
    elif not isinstance(values, (list, tuple)):
        raise RewardError(f"{what}, got {kind}")
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise RewardError(f"{what}, got {type(v).__name__} {_short(v)} at index {i} "
                              f"({where})")
        try:
            out.append(float(v))
        except OverflowError:
            raise RewardError(f"{what}: value {i} ({_short(v)}) does not fit in a float "
                              f"({where})") from None
    if len(out) != n:
        raise RewardError(f"reward function {name} returned {len(out)} values for {n} "
                          f"samples ({where})")
    return out


def _short(value) -> str:
    text = repr(value) if not isinstance(value, int) else str(value) if value.bit_length() < 200 \
        else f"an integer of {len(str(value))} digits"
    return text if len(text) <= 40 else text[:37] + "..."


def call_plugin(fn: Callable, flag: str, *args, timeout: float | None = None,
                timeout_flag: str = "--reward-timeout"):
    """``fn(*args)`` of a user plug-in (filters, ``--custom-reward-post-process-path``,
    ``--custom-advantage-function-path``, the TIS plug-in): anything it raises,
    ``sys.exit()`` and ``KeyboardInterrupt`` included, or a call past ``timeout`` seconds
    (``timeout_flag`` names where it comes from), becomes one :class:`RewardError` line
    naming ``flag``."""
    try:
        return call_with_deadline(fn, args, timeout)
    except CallTimeout as e:
        raise RewardError(f"{flag}: the function {e.reason()} ({timeout_flag} "
                          f"{timeout:g} s)") from None
    except CallRaised as raised:
        raise RewardError(f"{flag}: the function raised {error_summary(raised.error)}"
                          ) from raised.error
