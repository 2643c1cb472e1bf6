"""``relax train`` configuration: flags, the built-in preset, resolution and validation.

    cfg = parse_train_config(["--advantage-estimator", "reinforce_plus_plus", ...])

returns the resolved :class:`argparse.Namespace` (attributes = argparse dests plus
``world_size`` and ``builtin_preset_applied``) or raises :class:`ConfigError` whose text
is the one-line message ``--flag VALUE: reason and what to set instead``. Nothing here
imports torch or transformers (reinforce_plus_plus.md §8: validation runs before anything heavy).
"""

from __future__ import annotations

import json
import os
from argparse import Namespace

from relax.config.eval_flags import BUILTIN_EVAL_PROMPTS, resolve_eval_command
from relax.config.flags import build_eval_parser, build_train_parser, explicit_dests
from relax.config.presets import BUILTIN_PRESET, BUILTIN_TASK_NAMES, apply_builtin_preset
from relax.config.validate import (
    ESTIMATOR_NAMES,
    ConfigError,
    resolve_and_validate,
    world_size_from_env,
)

__all__ = [
    "BUILTIN_EVAL_PROMPTS",
    "BUILTIN_PRESET",
    "BUILTIN_TASK_NAMES",
    "ESTIMATOR_NAMES",
    "ConfigError",
    "config_to_json",
    "parse_eval_config",
    "parse_train_config",
]


def parse_train_config(argv: list[str], environ=None) -> Namespace:
    """Parse, apply the built-in preset, resolve derived values and validate.

    ``environ`` (default ``os.environ``) supplies ``WORLD_SIZE``. ``--help`` prints and
    raises ``SystemExit(0)`` as argparse does.
    """
    argv = list(argv)
    ns = build_train_parser().parse_strict(argv)
    explicit = explicit_dests(argv)
    ns.builtin_preset_applied = apply_builtin_preset(ns, explicit)
    return resolve_and_validate(ns, explicit, world_size_from_env(environ))


def parse_eval_config(argv: list[str]) -> Namespace:
    """``relax eval`` flags, parsed and validated (raises :class:`ConfigError`)."""
    argv = list(argv)
    ns = build_eval_parser().parse_strict(argv)
    explicit = {t.split("=", 1)[0][2:].replace("-", "_") for t in argv if t.startswith("--")}
    return resolve_eval_command(ns, explicit)


def config_to_json(cfg: Namespace) -> str:
    """The resolved configuration as sorted, indented JSON (what config.json holds)."""
    return json.dumps(vars(cfg), indent=2, sort_keys=True)


def write_config(cfg: Namespace) -> str:
    """Write ``OUTPUT_DIR/config.json`` (creating the directory, deleting nothing)."""
    os.makedirs(cfg.output_dir, exist_ok=True)
    path = os.path.join(cfg.output_dir, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config_to_json(cfg) + "\n")
    return path
