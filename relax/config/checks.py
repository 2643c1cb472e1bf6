"""Checks the ``relax train`` and ``relax eval`` rules share: URLs, paths checked without
running user code, ``--env`` names, reasoning-gym specs and ``--eval-prompt-data`` pairs (the
one-line error itself: :func:`relax.config.section.reject`).

Every function reads a config (:mod:`relax.config.schema`) and raises
:class:`~relax.errors.ConfigError`; none changes it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
from urllib.parse import urlsplit

from relax.config.constants import LIBRARIES
from relax.config.gym_spec import PREFIX as GYM_PREFIX
from relax.config.gym_spec import is_reasoning_gym, parse_spec
from relax.config.section import reject, value_of
from relax.errors import ConfigError, InputError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def url_problem(url: str, example: str = "http://127.0.0.1:8000") -> str | None:
    """Why ``url`` cannot be a server's address, or None. ``urlsplit`` raises on some
    malformed URLs (``http://[::1``) and reading ``port`` on others (``http://h:99999``): both
    are asked here, so a URL flag is refused in one line instead of failing at the first
    request with a traceback."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- reading it raises ValueError for a port that is not one
    except ValueError as e:
        return f"not a URL ({e}); give an http(s) URL such as {example}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r} is not an http(s) URL with a host (http:// or https://), such as {example}"
    return None


def check_url(cfg, dest: str, url: str | None, example: str = "http://127.0.0.1:8000") -> None:
    """The URL flag ``dest`` (one of its values: ``url``) must be a server's address."""
    problem = None if url is None else url_problem(url, example)
    if problem:
        reject(cfg, dest, problem)


def check_custom_path(cfg, dest: str) -> None:
    """``module:function`` or ``path/file.py:function``; the file or module must exist.

    A dotted module is found package by package on the file system (``find_spec`` on a dotted
    name would import the parents), so no user code runs during validation."""
    value = value_of(cfg, dest)
    if value is None:
        return
    where, sep, func = value.rpartition(":")
    if not sep or not where or not all(p.isidentifier() for p in func.split(".")):
        reject(cfg, dest, "expected 'module:function' or 'path/file.py:function'")
    if where.endswith(".py"):
        if not os.path.isfile(where):
            reject(cfg, dest, f"file {where!r} does not exist; give an existing .py file")
        return
    parts = where.split(".")
    if not all(p.isidentifier() for p in parts):
        reject(cfg, dest, f"{where!r} is not a module name; expected 'module:function' or "
               "'path/file.py:function'")
    try:
        spec = importlib.util.find_spec(parts[0])
        for i in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                spec = None
                break
            spec = importlib.machinery.PathFinder.find_spec(
                ".".join(parts[: i + 1]), list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        reject(cfg, dest, f"module {where!r} not found on the Python path; check the name or "
               "use 'path/file.py:function'")


def check_env_name(cfg) -> None:  # a config or its episodes section
    """``--env``: gem:ID / textarena:ID with the library installed, or an importable
    'module:factory' / 'path/file.py:factory' (nothing is imported: relax/rollout/agents/envs.py)."""
    prefix, sep, env_id = value_of(cfg, "env").partition(":")
    if sep and prefix in LIBRARIES:
        if not env_id:
            reject(cfg, "env", f"expected {prefix}:ENVIRONMENT_ID")
        if importlib.util.find_spec(LIBRARIES[prefix]) is None:
            reject(cfg, "env", f"the {prefix} library is not installed; make install in "
                   "a clone brings it (the README shows the commands by hand), or use a "
                   "'module:factory' environment")
        return
    where, _, factory = value_of(cfg, "env").rpartition(":")
    if not where or not factory.isidentifier():
        reject(cfg, "env", "expected gem:ID, textarena:ID, 'module:factory' or "
               "'path/file.py:factory'")
    check_custom_path(cfg, "env")


def check_gym_spec(spec: str, flag: str, *, role: str):
    """Parse a ``reasoning-gym:`` source (imports the package, generates nothing)."""
    try:
        return parse_spec(spec, flag, role=role)
    except InputError as e:
        first, _, reason = str(e).partition(": ")
        raise ConfigError(first, reason) from None


def check_gym_answer(cfg, explicit: set[str], sources: list) -> None:
    """``--reasoning-gym-answer`` only means something with a reasoning-gym source and the
    sources' own reward (not with --rm-type / --custom-rm-path)."""
    if "reasoning_gym_answer" not in explicit:
        return
    if not any(is_reasoning_gym(s) for s in sources):
        reject(cfg, "reasoning_gym_answer", "applies only to reasoning-gym:NAME sources of "
               "--prompt-data / --eval-prompt-data; remove it")
    if cfg.rollout.rewards.rm_type is not None or cfg.rollout.rewards.custom_rm_path is not None:
        reject(cfg, "reasoning_gym_answer", "the reward comes from --rm-type / "
               "--custom-rm-path, which read the response themselves; remove one of them")


def eval_pairs(cfg) -> list[list[str]] | None:
    """``--eval-prompt-data`` tokens -> ``[[name, path], ...]``; the files must exist.

    One ``PATH`` names the set after the file stem (or the reasoning-gym dataset)."""
    tokens = cfg.evaluation.eval_prompt_data
    if tokens is None:
        return None
    if len(tokens) == 1:
        stem = (tokens[0][len(GYM_PREFIX):].partition("?")[0] if is_reasoning_gym(tokens[0])
                else os.path.splitext(os.path.basename(tokens[0].rstrip("/")))[0])
        pairs = [[re.sub(r"[^A-Za-z0-9_.-]", "_", stem) or "eval", tokens[0]]]
    elif len(tokens) % 2:
        reject(cfg, "eval_prompt_data", f"got {len(tokens)} values; give one PATH or "
               "NAME PATH pairs, e.g. --eval-prompt-data gsm8k data/gsm8k/test.jsonl")
    else:
        pairs = [list(tokens[i:i + 2]) for i in range(0, len(tokens), 2)]
    seen = set()
    for name, path in pairs:
        if not _NAME.match(name):
            reject(cfg, "eval_prompt_data", f"name {name!r} must use only letters, digits, "
                   "'_', '.' and '-' (it becomes the metric name eval/<name>/...)")
        if name in seen:
            reject(cfg, "eval_prompt_data", f"name {name!r} given twice; names must differ")
        seen.add(name)
        if is_reasoning_gym(path):
            check_gym_spec(path, f"--eval-prompt-data {name}", role="eval")
        elif not os.path.isfile(path):
            reject(cfg, "eval_prompt_data", f"{path}: no such file; give a .jsonl or .parquet "
                   "prompt file, or reasoning-gym:NAME")
    return pairs


def check_dir(cfg, dest: str, what: str) -> None:
    """The directory flag ``dest``, when set, names an existing directory (``what`` it holds)."""
    value = value_of(cfg, dest)
    if value is not None and not os.path.isdir(value):
        reject(cfg, dest, f"no such directory; point it at {what}")


def check_not_a_file(cfg, dest: str) -> None:
    """A directory the run will write into is not an existing file."""
    value = value_of(cfg, dest)
    if value is not None and os.path.exists(value) and not os.path.isdir(value):
        reject(cfg, dest, "exists and is not a directory; choose another path")
