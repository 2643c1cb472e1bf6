"""The containment boundary of ``--env`` environments: every ``reset`` and ``step`` goes
through :class:`GuardedEnv`, which turns whatever the user's code does into either a checked
value or an :class:`EnvFailure` with a one-line reason (the episode fails; the collector
applies ``--reward-error-policy``, relax/rollout/episode_collector.py).

Contained: any exception, ``SystemExit``, ``RecursionError``, and a ``KeyboardInterrupt``
raised by the environment itself; a ``reset`` that returns anything but text; a ``step`` that
returns anything but ``(observation, reward, done)``, a reward that is not a real number or is
NaN/inf, an observation that is not text (unless the step ends the episode) or not valid
UTF-8. Not contained: the trainer's own stop (:func:`relax.errors.stops_the_run`), which
propagates from wherever the main thread was.

Time limit (``--env-step-timeout T``, off by default): each ``reset`` and ``step`` runs on a
daemon thread and the trainer waits at most ``T`` seconds. A call that runs over fails its
episode and is abandoned, not stopped (Python cannot stop a thread): it may go on running on
its thread until it returns, so the environment object is dropped and the next episode of the
slot plays a fresh one from the factory. Without the flag the calls run on the main thread,
as before, and a hung environment is stopped only by a second SIGTERM/SIGINT.
"""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable

from relax.errors import error_summary, invalid_text, stops_the_run, value_summary


class EnvFailure(Exception):
    """One call of an environment failed; ``str(e)`` is the one-line reason."""


class GuardedEnv:
    """``env`` behind the boundary; ``make`` (the factory) builds a replacement after a call
    ran past ``timeout_s`` (None: no time limit, calls run on the caller's thread)."""

    def __init__(self, env, make: Callable | None = None, timeout_s: float | None = None):
        self.env, self.make, self.timeout_s = env, make, timeout_s

    def reset(self, seed: int) -> str:
        """The first observation (text), or EnvFailure."""
        if self.env is None:
            if self.make is None:
                raise EnvFailure("the environment was abandoned after a call ran past "
                                 "--env-step-timeout and cannot be rebuilt")
            self.env = self._call(self.make, "factory")
        text = self._call(self.env.reset, "reset", seed)
        return _text(text, "reset")

    def step(self, action: str) -> tuple[str | None, float, bool]:
        """``(observation, reward, done)`` checked; the observation is text unless done."""
        out = self._call(self.env.step, "step", action)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            raise EnvFailure(f"the environment's step returned {value_summary(out)}; expected "
                             "(observation, reward, done)")
        observation, reward, done = out
        reward = _reward(reward)
        try:
            done = bool(done)
        except Exception as e:  # an array's truth value, a __bool__ that raises
            raise EnvFailure(f"the environment's step returned done={value_summary(done)}, "
                             f"which is not true or false ({error_summary(e)})") from None
        return (None if done else _text(observation, "step")), reward, done

    def _call(self, fn, what: str, *args):
        if self.timeout_s is None:
            try:
                return fn(*args)
            except BaseException as e:
                if stops_the_run(e):
                    raise
                raise EnvFailure(_raised_by(what, e)) from None
        box: dict = {}
        done = threading.Event()

        def target():
            try:
                box["value"] = fn(*args)
            except BaseException as e:  # SystemExit would end the thread silently
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, daemon=True, name=f"relax-env-{what}").start()
        if not done.wait(self.timeout_s):  # a signal's Interrupted propagates from here
            self.env = None  # still in use by the abandoned call: the next reset builds anew
            raise EnvFailure(f"the environment's {what} did not return within "
                             f"--env-step-timeout {self.timeout_s:g} s (abandoned)")
        if "error" in box:
            raise EnvFailure(_raised_by(what, box["error"]))
        return box["value"]


def _raised_by(what: str, error: BaseException) -> str:
    # "the environment raised" for step: the wording the error policy's messages always had
    who = "the environment" if what == "step" else f"the environment's {what}"
    return f"{who} raised {error_summary(error)}"


def _text(value, what: str) -> str:
    if not isinstance(value, str):
        raise EnvFailure(f"the environment's {what} returned the observation "
                         f"{value_summary(value)}; expected text (str)")
    bad = invalid_text(value)
    if bad:
        raise EnvFailure(f"the environment's {what} returned an observation that is {bad}")
    return value


def _reward(value) -> float:
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()  # a 0-d NumPy array or torch tensor
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise EnvFailure(f"the environment's step returned the reward "
                         f"{value_summary(value)}; expected a real number")
    try:
        reward = float(value)
    except (OverflowError, ValueError, TypeError) as e:
        raise EnvFailure(f"the environment's step returned the reward "
                         f"{value_summary(value)}, which is not a float "
                         f"({error_summary(e)})") from None
    if not math.isfinite(reward):
        raise EnvFailure(f"the environment's step returned a non-finite reward {reward}")
    return reward


def guarded_factory(make: Callable, timeout_s: float | None) -> Callable[[], GuardedEnv]:
    """A factory of guarded environments (the first one built by the caller: a factory that
    fails at start-up is bad input, relax/rollout/envs.py)."""
    return lambda: GuardedEnv(make(), make, timeout_s)
