"""Reward functions: the math reward, the built-in tasks' rewards, user functions by path.

Every reward function has the signature
``function(prompts: list[str], responses: list[str], labels: list) -> list[float]``.
User functions are named ``module:function`` (importable module) or ``path/file.py:function``.
:func:`score` checks what comes back: a function that raises, returns the wrong number of values
or a NaN/Inf is an error naming the sample and the start of its prompt, never a silent zero.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable

from relax.trainer.errors import InputError, RewardError

RewardFn = Callable[[list[str], list[str], list], list[float]]


def load_function(spec: str, flag: str) -> Callable:
    """Import ``module:function`` or ``path/to/file.py:function``; errors name ``flag``."""
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
    except Exception as e:  # the user's module failing to import is bad input, said in one line
        raise InputError(f"{flag} {spec}: cannot import {target}: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise InputError(f"{flag} {spec}: {target} has no function {name!r}")
    return fn


def build_reward_fn(custom_rm_path: str | None, rm_type: str | None) -> tuple[RewardFn, str]:
    """The reward function and a short name for messages."""
    if custom_rm_path:
        return load_function(custom_rm_path, "--custom-rm-path"), custom_rm_path
    if rm_type in (None, "math"):
        from relax.rollout.math_reward import math_reward

        return math_reward, "math"
    from relax.rollout.tasks import get_task

    try:
        return get_task(rm_type).reward, rm_type
    except ValueError as e:
        raise InputError(f"--rm-type {rm_type}: {e}") from None


def _describe(i: int, prompts: list[str], index_base: int) -> str:
    head = prompts[i][:60].replace("\n", "\\n")
    return f"sample {index_base + i} (prompt {head!r}{'...' if len(prompts[i]) > 60 else ''})"


def score(
    fn: RewardFn,
    prompts: list[str],
    responses: list[str],
    labels: list,
    *,
    name: str = "reward",
    index_base: int = 0,
) -> list[float]:
    """Call ``fn`` on the batch and validate the result; ``index_base`` offsets sample numbers."""
    try:
        values = fn(prompts, responses, labels)
    except Exception as batch_error:
        # Find the sample that fails by itself, so the message can name it.
        for i in range(len(prompts)):
            try:
                fn(prompts[i : i + 1], responses[i : i + 1], labels[i : i + 1])
            except Exception as e:
                raise RewardError(
                    f"reward function {name} raised on {_describe(i, prompts, index_base)}: "
                    f"{type(e).__name__}: {e}"
                ) from e
        raise RewardError(
            f"reward function {name} raised on a batch of {len(prompts)} samples starting at "
            f"sample {index_base}: {type(batch_error).__name__}: {batch_error}"
        ) from batch_error
    try:
        values = [float(v) for v in values]
    except (TypeError, ValueError) as e:
        raise RewardError(f"reward function {name} must return a list of floats: {e}") from e
    if len(values) != len(prompts):
        raise RewardError(
            f"reward function {name} returned {len(values)} values for {len(prompts)} samples "
            f"(samples {index_base}..{index_base + len(prompts) - 1})"
        )
    for i, v in enumerate(values):
        if not math.isfinite(v):
            raise RewardError(
                f"reward function {name} returned {v} for {_describe(i, prompts, index_base)}"
            )
    return values
