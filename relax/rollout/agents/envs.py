"""Environments an episode rollout plays against (``--env``): one interface, three sources.

The interface Relax calls, and the one a user's own environment implements::

    class MyEnv:
        def reset(self, seed: int) -> str:
            '''Start a new episode; return the first observation (the model's first prompt).'''
        def step(self, action: str) -> tuple[str, float, bool]:
            '''Act with the model's decoded turn; return (observation, reward, done).'''

``--env module:factory`` (or ``path/file.py:factory``) names a function that takes no
arguments and returns a fresh environment; the trainer calls it once per episode slot and
reuses the objects across rollout steps (``reset`` starts each episode). The episode reward
is the sum of the rewards ``step`` returned (relax/rollout/agents/episodes.py).

``--env gem:ID`` and ``--env textarena:ID`` wrap the environments of those libraries (the
``agents`` extra and gem-llm: ``make install`` in a clone, see the Makefile for why gem-llm is
installed with ``--no-deps``), imported only when named here, so
validation and ``--dry-run`` never import them.

Both libraries reseed Python's global ``random`` on reset; nothing in Relax draws from the
global stream (prompt sources, the sampler and the environment seeds use their own
generators), so this cannot change what the trainer samples.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import Protocol

from relax.config.constants import LIBRARIES  # --env prefix -> the importable module
from relax.errors import InputError, error_summary
from relax.plugins import load_function
from relax.rollout.agents.env_guard import start_environments


class Environment(Protocol):
    def reset(self, seed: int) -> str: ...

    def step(self, action: str) -> tuple[str, float, bool]: ...


class GemEnv:
    """A gem environment: ``reset(seed)`` -> (observation, info), ``step(text)`` -> (observation,
    reward, terminated, truncated, info). The hint gem keeps in ``info['suffix']`` (e.g. "Enter
    your next guess.") is part of what its own chat wrappers show the model, so it is appended."""

    def __init__(self, env):
        self.env = env

    def reset(self, seed: int) -> str:
        observation, info = self.env.reset(seed=seed)
        return _with_suffix(observation, info)

    def step(self, action: str) -> tuple[str, float, bool]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        return _with_suffix(observation, info), float(reward), bool(terminated or truncated)


def _with_suffix(observation, info) -> str:
    suffix = info.get("suffix") if isinstance(info, dict) else None
    return f"{observation}\n{suffix}" if suffix else str(observation)


class TextArenaEnv:
    """A single-player textarena environment. Its observation is the list of (sender, text,
    kind) messages since the player last acted; the player's own echoed action is dropped. Its
    reward arrives only when the game ends (``close()``), as the step reward of the last turn."""

    player = 0

    def __init__(self, env):
        self.env = env

    def reset(self, seed: int) -> str:
        self.env.reset(num_players=1, seed=seed)
        return self._observation()

    def step(self, action: str) -> tuple[str, float, bool]:
        done, _ = self.env.step(action)
        if not done:
            return self._observation(), 0.0, False
        rewards, _ = self.env.close()
        return "", float((rewards or {}).get(self.player, 0.0)), True

    def _observation(self) -> str:
        _, messages = self.env.get_observation()
        if isinstance(messages, str):
            return messages
        return "\n".join(str(m[1]) for m in messages if m[0] != self.player)


def _library_factory(prefix: str, env_id: str) -> Callable[[], Environment]:
    module = LIBRARIES[prefix]
    if importlib.util.find_spec(module) is None:
        how = ("pip install -e '.[agents]' then pip install --no-deps gem-llm==0.1.0"
               if prefix == "gem" else "pip install -e '.[agents]'")
        raise InputError(f"--env {prefix}:{env_id}: the {prefix} library is not installed; "
                         f"in a clone of Relax: make install, or {how}")
    make = importlib.import_module(module).make
    wrap = GemEnv if prefix == "gem" else TextArenaEnv
    return lambda: wrap(make(env_id))


def environment_factory(spec: str, timeout_s: float | None = None) -> Callable[[], Environment]:
    """The zero-argument constructor named by ``--env SPEC``; bad input raises InputError.

    The first environment is built here, within the factory's deadline (``timeout_s``, the
    run's ``--env-step-timeout``, else relax/rollout/agents/env_guard.py ``FACTORY_TIMEOUT_S``), so
    an unknown id, a factory that raises, exits or hangs stops the run before any model is
    loaded."""
    prefix, sep, rest = spec.partition(":")
    library = sep and prefix in LIBRARIES
    make = _library_factory(prefix, rest) if library else load_function(spec, "--env")
    try:
        start_environments(make, 1, name=f"--env {spec}", timeout_s=timeout_s)
    except InputError as e:
        raised = e.__cause__
        if not library or raised is None or not isinstance(raised, Exception):
            raise
        # an unknown id is bad input: say what the library said
        raise InputError(f"--env {spec}: {prefix} cannot make it ({error_summary(raised)}); "
                         f"give an environment id that {prefix} registers") from None
    return make
