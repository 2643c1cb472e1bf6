"""``relax train`` / ``relax eval`` configuration: the typed settings, their flags, the
built-in preset, resolution and validation.

    cfg = parse_train_config(["--advantage-estimator", "reinforce_plus_plus", ...])

returns the resolved, frozen :class:`TrainConfig` (a tree of sections: ``cfg.algorithm``,
``cfg.rollout.sampling``, ...; relax/config/schema.py) or raises :class:`ConfigError` whose text is
the one-line message ``--flag VALUE: reason and what to set instead``. Nothing here imports
torch or transformers (reinforce_plus_plus.md §8: validation runs before anything heavy).
"""

from __future__ import annotations

import json
import os

from relax.config.eval_command import resolve_eval_command
from relax.config.files import as_argv, load_file, unresolved
from relax.config.flags import build_eval_parser, build_train_parser, explicit_dests
from relax.config.presets import BUILTIN_PRESET, BUILTIN_TASK_NAMES, preset_values
from relax.config.schema import EvalConfig, TrainConfig
from relax.config.section import flat_defaults, from_flat, replace_flat
from relax.config.sections.evaluation import BUILTIN_EVAL_PROMPTS
from relax.config.validate import resolve_and_validate, world_size_from_env
from relax.errors import ConfigError
from relax.estimators import ESTIMATOR_NAMES

__all__ = [
    "BUILTIN_EVAL_PROMPTS",
    "BUILTIN_PRESET",
    "BUILTIN_TASK_NAMES",
    "ESTIMATOR_NAMES",
    "ConfigError",
    "EvalConfig",
    "TrainConfig",
    "config_to_json",
    "parse_eval_config",
    "parse_train_config",
    "replace_flat",
]


def parse_train_config(argv: list[str], environ=None) -> TrainConfig:
    """Parse (the ``--config`` files first, in order, the flags over them), apply the built-in
    preset, resolve derived values and validate.

    ``environ`` (default ``os.environ``) supplies ``WORLD_SIZE``. ``--help`` prints and
    raises ``SystemExit(0)`` as argparse does.
    """
    argv = list(argv)
    paths = vars(build_train_parser().parse_strict(argv))["config"] or []
    given = explicit_dests(build_train_parser, argv) - {"config"}
    from_files = _file_settings(paths, given)
    # the files' settings as flags before the command line's: the same types, bounds, errors
    values = vars(build_train_parser().parse_strict(
        as_argv(from_files, build_train_parser()) + argv))
    del values["config"]
    defaults = flat_defaults(TrainConfig)
    # A file value is given: the preset never replaces it, so a run's config.json reproduces
    # the run. For the rules that refuse a flag without effect, a file key equal to its
    # default counts as absent: config.json lists every field, read or not.
    explicit = given | {dest for dest in from_files if values[dest] != defaults[dest]}
    preset = preset_values(values, given | set(from_files))
    cfg = from_flat(TrainConfig, {**values, **(preset or {}),
                                  "builtin_preset_applied": preset is not None})
    return resolve_and_validate(cfg, explicit, world_size_from_env(environ))


def _file_settings(paths: list[str], given: set[str]) -> dict:
    """The settings of the ``--config`` files, merged in order (a later file's key wins),
    that the command line does not give."""
    settings: dict = {}
    for path in paths:
        settings.update(unresolved(load_file(path, TrainConfig)))
    return {dest: value for dest, value in settings.items() if dest not in given}


def parse_eval_config(argv: list[str]) -> EvalConfig:
    """``relax eval`` flags, parsed and validated (raises :class:`ConfigError`)."""
    argv = list(argv)
    cfg = from_flat(EvalConfig, vars(build_eval_parser().parse_strict(argv)))
    return resolve_eval_command(cfg, explicit_dests(build_eval_parser, argv))


def config_to_json(cfg: TrainConfig | EvalConfig) -> str:
    """The resolved configuration by section as sorted, indented JSON (what config.json
    holds and ``--dry-run`` prints)."""
    return json.dumps(cfg.to_dict(), indent=2)


def write_config(cfg: TrainConfig) -> str:
    """Write ``OUTPUT_DIR/config.json`` (creating the directory, deleting nothing)."""
    os.makedirs(cfg.run.output_dir, exist_ok=True)
    path = os.path.join(cfg.run.output_dir, "config.json")
    with open(path, "w", encoding="utf-8") as f:
        f.write(config_to_json(cfg) + "\n")
    return path
