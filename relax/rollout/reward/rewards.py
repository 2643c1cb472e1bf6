"""Reward functions: the math reward, the built-in tasks' rewards, user functions by path.

Every reward function has the signature
``function(prompts: list[str], responses: list[str], labels: list) -> list[float]``.
User functions are named ``module:function`` (importable module) or ``path/file.py:function``.
:func:`score_with_errors` runs it under a per-sample time limit (``--reward-timeout``) and checks
what comes back: a function that raises, times out, returns the wrong number of values or a
NaN/Inf (or a value beyond float32, the rewards' dtype) is an error naming the sample and the start of its prompt, or -- only with
``--reward-error-policy zero`` -- a 0.0 reported in a message and counted, never a silent zero.
"""

from __future__ import annotations

from collections.abc import Callable

from relax.errors import InputError, RewardError
from relax.plugins import (
    CallRaised,
    CallTimeout,
    bad_reward,
    call_with_deadline,
    load_function,
    real_values,
)
from relax.rollout.prompts.reasoning_gym_source import make_reward
from relax.rollout.prompts.tasks import get_task
from relax.rollout.reward.math_reward import math_reward

RewardFn = Callable[[list[str], list[str], list], list[float]]

def build_reward_fn(custom_rm_path: str | None, rm_type: str | None, *,
                    gym_answer: str | None = None) -> tuple[RewardFn, str]:
    """The reward function and a short name for messages.

    ``gym_answer`` (a ``--reasoning-gym-answer`` format) selects the reasoning-gym verifier
    when neither ``custom_rm_path`` nor ``rm_type`` is given: the data is a reasoning-gym
    source, whose labels are its items."""
    if custom_rm_path:
        return (load_function(custom_rm_path, "--custom-rm-path"),
                f"--custom-rm-path {custom_rm_path}")
    if rm_type is None and gym_answer is not None:
        return make_reward(gym_answer), f"reasoning-gym ({gym_answer})"
    if rm_type in (None, "math"):
        return math_reward, "math"
    try:
        return get_task(rm_type).reward, rm_type
    except ValueError as e:
        raise InputError(f"--rm-type {rm_type}: {e}") from None


def _describe(i: int, prompts: list[str], index_base: int) -> str:
    head = prompts[i][:60].replace("\n", "\\n")
    return f"sample {index_base + i} (prompt {head!r}{'...' if len(prompts[i]) > 60 else ''})"


def score_with_errors(
    fn: RewardFn,
    prompts: list[str],
    responses: list[str],
    labels: list,
    *,
    name: str = "reward",
    index_base: int = 0,
    timeout: float | None = None,
    policy: str = "raise",
) -> tuple[list[float], list[str]]:
    """Rewards of a batch and the messages of the samples that failed.

    ``timeout`` is seconds per sample: the batch call may take ``timeout * len(prompts)``.
    When it raises, runs over, or returns the wrong count or non-numbers, each sample is
    scored alone (``timeout`` each) to find the failing ones. A failing sample -- it raises,
    times out, or is NaN/Inf -- is a :class:`RewardError` naming it (``policy="raise"``), or
    (``policy="zero"``) scores 0.0 and gets one message in the returned list.
    """
    n = len(prompts)
    values, batch_error = _score_batch(fn, prompts, responses, labels, name=name,
                                       index_base=index_base, timeout=timeout, policy=policy)
    if batch_error is None:
        return _zero_non_finite(values, prompts, name=name, index_base=index_base, policy=policy)
    # Score the samples one by one, so a message can name the failing one.
    values, errors = [], []
    for i in range(n):
        v, msg = _score_one(fn, prompts, responses, labels, i, name=name,
                            index_base=index_base, timeout=timeout)
        if msg is not None:
            if policy == "raise":
                raise RewardError(msg) from batch_error.__cause__
            errors.append(msg)
            v = 0.0
        values.append(v)
    if not errors and policy == "raise":
        raise batch_error  # every sample passes alone: the batch as a whole is the problem
    return values, errors


def _score_batch(fn, prompts, responses, labels, *, name, index_base, timeout, policy):
    """``(values, None)`` from one call on the whole batch, or ``(None, error)`` saying why
    that call cannot be used (raised, timed out, or returned something else than n numbers;
    the last raises at once under ``policy="raise"``: a bug of the whole batch)."""
    n = len(prompts)
    batch_limit = None if timeout is None else timeout * max(n, 1)
    where = f"samples {index_base}..{index_base + n - 1}"
    try:
        got = call_with_deadline(fn, (prompts, responses, labels), batch_limit)
        return real_values(got, n, name, where), None
    except CallTimeout as e:
        return None, RewardError(
            f"reward function {name} {e.reason()} for a batch of {n} samples ({where}; "
            f"--reward-timeout {timeout:g} s per sample)")
    except RewardError as e:
        if policy == "raise":
            raise
        return None, e
    except CallRaised as raised:
        e = raised.error
        error = RewardError(
            f"reward function {name} raised on a batch of {n} samples starting at sample "
            f"{index_base}: {type(e).__name__}: {e}")
        error.__cause__ = e
        return None, error


def _zero_non_finite(values, prompts, *, name, index_base, policy):
    """NaN/Inf rewards: a RewardError naming the sample, or 0.0 and a message each."""
    errors = []
    for i, v in enumerate(values):
        problem = bad_reward(v)
        if problem is not None:
            msg = (f"reward function {name} returned {problem} for "
                   f"{_describe(i, prompts, index_base)}")
            if policy == "raise":
                raise RewardError(msg)
            errors.append(msg)
            values[i] = 0.0
    return values, errors


def _score_one(fn, prompts, responses, labels, i, *, name, index_base, timeout):
    """``(reward, None)`` of sample ``i`` alone, or ``(None, one-line message)`` when it fails."""
    one = (prompts[i : i + 1], responses[i : i + 1], labels[i : i + 1])
    where = _describe(i, prompts, index_base)
    try:
        got = call_with_deadline(fn, one, timeout)
        (v,) = real_values(got, 1, name, f"sample {index_base + i}")
        problem = bad_reward(v)
        if problem is None:
            return v, None
        msg = f"reward function {name} returned {problem} for {where}"
    except CallTimeout as e:
        msg = (f"reward function {name} timed out after {timeout:g} s (--reward-timeout) on "
               f"{where}" if not e.busy else f"reward function {name} {e.reason()} on {where}")
    except RewardError as e:
        msg = f"{e} on {where}"
    except CallRaised as raised:
        e = raised.error
        msg = f"reward function {name} raised on {where}: {type(e).__name__}: {e}"
    return None, " ".join(msg.split())  # one line, whatever the exception text holds


def score(fn: RewardFn, prompts: list[str], responses: list[str], labels: list, *,
          name: str = "reward", index_base: int = 0, timeout: float | None = None) -> list[float]:
    """Validated rewards of a batch; any failure is a :class:`RewardError` naming the sample."""
    values, _ = score_with_errors(fn, prompts, responses, labels, name=name,
                                  index_base=index_base, timeout=timeout, policy="raise")
    return values
