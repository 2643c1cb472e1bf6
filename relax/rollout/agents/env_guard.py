"""The containment boundary of ``--env`` environments: every call of the user's code -- the
factory, ``reset`` and ``step`` -- goes through :class:`GuardedEnv`, which turns whatever it
does into either a checked value or an :class:`EnvFailure` with a one-line reason (the episode
fails; the collector applies ``--reward-error-policy``, relax/rollout/episode_collector.py; at
start-up a failing factory is bad input, :func:`start_environments`).

Contained: any exception, ``SystemExit``, ``RecursionError``, and a ``KeyboardInterrupt``
raised by the environment itself; a factory that returns something without ``reset`` and
``step``; a ``reset`` that returns anything but text; a ``step`` that returns anything but
``(observation, reward, done)``, a reward that is not a real number or is NaN/inf, an
observation that is not text (unless the step ends the episode) or not valid UTF-8. Not
contained: the trainer's own stop (:func:`relax.errors.stops_the_run`), which propagates from
wherever the main thread was.

Deadlines (relax/plugins.py runs the calls): with ``--env-step-timeout T`` every factory,
``reset`` and ``step`` call runs on a worker thread and the trainer waits at most ``T``
seconds. Without it ``reset`` and ``step`` run on the main thread, as before (gem's math
graders use ``signal.alarm``, which works only there), and only the factory is bounded, by
:data:`FACTORY_TIMEOUT_S`. A call that runs over fails its episode and is abandoned, not
stopped (Python cannot stop a thread): it may go on running until it returns, so the
environment object is dropped and the next episode of the slot plays a fresh one from the
factory.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable

from relax.errors import InputError, error_summary, invalid_text, value_summary
from relax.plugins import CallRaised, CallTimeout, bad_reward, call_with_deadline

# The factory's deadline without --env-step-timeout: a factory may load a data set or start a
# game server, so it gets the time an agent episode gets by default (--agent-timeout).
FACTORY_TIMEOUT_S = 600.0


class EnvFailure(Exception):
    """One call of an environment failed; ``str(e)`` is the one-line reason, ``raised`` the
    exception the user code raised (None when it timed out or returned something wrong)."""

    def __init__(self, reason: str, raised: BaseException | None = None):
        super().__init__(reason)
        self.raised = raised


class GuardedEnv:
    """``env`` behind the boundary (None: not built yet, ``make`` builds it at the first
    ``reset``); ``make`` (the factory) builds a replacement after a call ran past ``timeout_s``
    (None: no time limit on ``reset`` and ``step``, which run on the caller's thread)."""

    def __init__(self, env, make: Callable | None = None, timeout_s: float | None = None):
        self.env, self.make, self.timeout_s = env, make, timeout_s

    def build(self) -> None:
        """Build the environment from the factory, or EnvFailure."""
        if self.make is None:
            raise EnvFailure("the environment was abandoned after a call ran past "
                             "--env-step-timeout and cannot be rebuilt")
        env = self._call(self.make, "factory")
        for name in ("reset", "step"):
            if not callable(getattr(env, name, None)):
                raise EnvFailure(f"what the factory returned ({type(env).__name__}) has no "
                                 f"{name}() method (relax/rollout/agents/envs.py documents the "
                                 "interface)")
        self.env = env

    def reset(self, seed: int) -> str:
        """The first observation (text), or EnvFailure."""
        if self.env is None:
            self.build()
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
        limit = self.timeout_s
        if limit is None and what == "factory":
            limit = FACTORY_TIMEOUT_S
        try:
            return call_with_deadline(fn, args, limit)
        except CallTimeout as e:
            if e.busy:
                raise EnvFailure(f"the environment's {what} {e.reason()}") from None
            self.env = None  # still in use by the abandoned call: the next reset builds anew
            where = (f"--env-step-timeout {limit:g} s" if self.timeout_s is not None else
                     f"{limit:g} s, the factory's limit without --env-step-timeout")
            raise EnvFailure(f"the environment's {what} did not return within {where} "
                             "(abandoned)") from None
        except CallRaised as raised:
            raise EnvFailure(_raised_by(what, raised.error), raised.error) from None


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
    problem = bad_reward(reward)  # rewards become float32 tensors: -1e300 is -inf there
    if problem is not None:
        raise EnvFailure(f"the environment's step returned the reward {problem}")
    return reward


def guarded_factory(make: Callable, timeout_s: float | None) -> Callable[[], GuardedEnv]:
    """A factory of guarded environments, each built by its first ``reset`` (so the factory's
    failures fail an episode, within the deadline)."""
    return lambda: GuardedEnv(None, make, timeout_s)


def start_environments(make: Callable, count: int, *, name: str,
                       timeout_s: float | None) -> list[GuardedEnv]:
    """``count`` environments built now, each within the factory's deadline: a factory that
    raises (``SystemExit`` included), returns no environment or does not return is bad input,
    one :class:`~relax.errors.InputError` line naming ``name`` (``--env SPEC``)."""
    envs = []
    for _ in range(count):
        env = GuardedEnv(None, make, timeout_s)
        try:
            env.build()
        except EnvFailure as e:
            raise InputError(f"{name}: {e}") from e.raised
        envs.append(env)
    return envs
