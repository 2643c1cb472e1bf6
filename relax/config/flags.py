"""The ``relax train`` and ``relax eval`` parsers, built from the fields of
:mod:`relax.config.schema` (flag = ``--`` + field name with ``-``; help and default from the
field, "Default X." written from the field's default).

The parsers only parse and type-check; every cross-flag rule lives in
:mod:`relax.config.validate` and :mod:`relax.config.eval_flags`. Their errors (unknown flag,
bad number, bad choice) are raised as :class:`~relax.errors.ConfigError` so that the command
line prints one line and exits 2, exactly like a rejected configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math

from relax.config.fields import GROUPS, help_text
from relax.config.schema import EvalConfig, TrainConfig
from relax.errors import ConfigError, invalid_text

TRAIN_DESCRIPTION = (
    "Train a language model with reinforcement learning (synchronous colocate rollout, then "
    "update). Without --hf-checkpoint and --prompt-data it trains the built-in tiny model on a "
    "built-in task with the built-in preset (docs/configuration.md). Rules: reinforce_plus_plus.md §8."
)
EVAL_DESCRIPTION = (
    "Evaluate a saved checkpoint: sample --n-samples-per-eval-prompt responses per prompt, "
    "score them with the reward, print eval/<name>/pass@k and eval/<name>/mean_reward as JSON "
    "(docs/configuration.md)."
)


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def text(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("expected a non-empty value")
    bad = invalid_text(value)
    if bad:
        raise argparse.ArgumentTypeError(bad)
    return value


# field annotation (without "| None") -> (argparse type, metavar)
_TYPES = {"float": (finite_float, "X"), "int": (integer, "N"), "str": (text, "STR"),
          "list": (text, None)}


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose errors become one-line :class:`ConfigError` s."""

    def error(self, message: str):
        hint = f"see {self.prog} --help"
        if message.startswith("argument "):
            head, _, reason = message[len("argument "):].partition(": ")
            # "-h/--help" style heads: keep the long spelling
            raise ConfigError(head.split("/")[-1], f"{reason}; {hint}")
        raise ConfigError(message, hint)

    def parse_strict(self, argv: list[str]) -> argparse.Namespace:
        """parse_args with a did-you-mean for unknown flags instead of argparse's list."""
        ns, extras = self.parse_known_args(argv)
        if extras:
            token = extras[0]
            if token.startswith("-"):
                name = token.split("=", 1)[0]
                known = [s for a in self._actions for s in a.option_strings]
                close = difflib.get_close_matches(name, known, n=1)
                hint = f"did you mean {close[0]}?" if close else f"see {self.prog} --help"
                raise ConfigError(name, f"unknown flag; {hint}")
            # name the flag the stray value follows, when there is one
            at = len(argv) - 1 - argv[::-1].index(token)
            before = [t for t in argv[:at] if t.startswith("--")]
            if not before:
                raise ConfigError(repr(token), f"unexpected argument; {self.prog} takes only "
                                  f"--flags; see {self.prog} --help")
            raise ConfigError(before[-1].split("=", 1)[0], f"unexpected extra value {token!r}; "
                              f"each flag takes at most one value; see {self.prog} --help")
        return ns


def _add_field(parser: argparse.ArgumentParser, groups: dict, f: dataclasses.Field,
               suppress_defaults: bool) -> None:
    md = f.metadata
    kind = f.type.replace(" | None", "")
    kw: dict = dict(help=help_text(f))
    if md["positional"]:
        parser.add_argument(f.name, metavar=md["metavar"], help=help_text(f))
        return
    if kind == "bool":  # a switch; --bf16 / --no-bf16 when "unset" (None) means "by device"
        kw["action"] = argparse.BooleanOptionalAction if "None" in f.type else "store_true"
    elif md["choices"] is not None:
        kw["choices"] = md["choices"]
    else:
        kw["type"], kw["metavar"] = _TYPES[kind]
    if md["nargs"]:
        kw["nargs"] = md["nargs"]
    if md["metavar"]:
        kw["metavar"] = md["metavar"]
    kw["default"] = argparse.SUPPRESS if suppress_defaults else f.default
    group = md["group"]
    if group not in groups:
        groups[group] = parser.add_argument_group(group, GROUPS.get(group))
    groups[group].add_argument("--" + f.name.replace("_", "-"), dest=f.name, **kw)


def _build(config_cls, prog: str, description: str, suppress_defaults: bool) -> OneLineParser:
    parser = OneLineParser(prog=prog, description=description, allow_abbrev=False,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    groups: dict = {}
    # a base class's fields (FullyAsyncFields) after the class's own, in --help too
    inherited = {f.name for base in config_cls.__mro__[1:] if dataclasses.is_dataclass(base)
                 for f in dataclasses.fields(base)}
    fields = dataclasses.fields(config_cls)
    for f in [f for f in fields if f.name not in inherited] + \
            [f for f in fields if f.name in inherited]:
        if f.metadata.get("flag", True):
            _add_field(parser, groups, f, suppress_defaults)
    return parser


def build_train_parser(prog: str = "relax train", suppress_defaults: bool = False) -> OneLineParser:
    """The ``relax train`` parser. ``suppress_defaults`` leaves unset flags out of the
    Namespace, which is how :func:`explicit_dests` sees what the user typed."""
    return _build(TrainConfig, prog, TRAIN_DESCRIPTION, suppress_defaults)


def build_eval_parser(suppress_defaults: bool = False) -> OneLineParser:
    """The ``relax eval CHECKPOINT`` parser (same one-line errors as ``relax train``)."""
    return _build(EvalConfig, "relax eval", EVAL_DESCRIPTION, suppress_defaults)


def explicit_dests(parser_builder, argv: list[str]) -> set[str]:
    """Fields the user passed on the command line (run after a successful full parse)."""
    ns, _ = parser_builder(suppress_defaults=True).parse_known_args(argv)
    return set(vars(ns))


def train_flags() -> dict[str, argparse.Action]:
    """Long flag name -> action, for docs and tests."""
    # the first long name: --bf16 for the pair --bf16 / --no-bf16
    return {a.option_strings[0]: a for a in build_train_parser()._actions
            if a.option_strings and a.dest != "help"}
