"""The ``relax train`` and ``relax eval`` parsers, built from the leaves of the sections
(:mod:`relax.config.schema`; flag = ``--`` + the field's dest with ``-``; help and default
from the field, "Default X." written from the field's default); ``--help`` has one group per
section (``rollout.sampling``), described by the section's docstring.

The parsers only parse and type-check; every rule lives with its section
(relax/config/sections/), run in order by :mod:`relax.config.validate` and
:mod:`relax.config.eval_command`. Their errors (unknown flag, bad number, bad choice) are
raised as :class:`~relax.errors.ConfigError` so that the command line prints one line and
exits 2, exactly like a rejected configuration.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math

from relax.config.schema import EVAL_FLAGS, EvalConfig, TrainConfig
from relax.config.section import dest_of, help_text, leaves
from relax.config.sections.backend import EVAL_HELP, EVAL_REFUSED
from relax.errors import ConfigError, invalid_text

TRAIN_DESCRIPTION = (
    "Train a language model with reinforcement learning (rollout, then update; with "
    "--fully-async on ranks of their own). Without --hf-checkpoint and --prompt-data it trains the built-in tiny model on a "
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
# flags that existed and were removed: the one line a command line using one gets
REMOVED = {
    "--colocate": "removed: it was never read; rollout and training share the ranks unless "
                  "--fully-async is given, so remove it",
    "--hybrid": "removed: it was only ever refused (not implemented); remove it (--fully-async "
                "puts rollout on ranks of its own)",
}
_EVAL_OUTPUT_HELP = ("Default none. Also write the metrics to OUTPUT_DIR/eval_metrics.json "
                     "(and, with --rollout-backend vllm, the server's log).")
_TYPES = {"float": (finite_float, "X"), "int": (integer, "N"), "str": (text, "STR"),
          "list": (text, None)}


class OneLineParser(argparse.ArgumentParser):
    """ArgumentParser whose errors become one-line :class:`ConfigError` s. ``refused``:
    flags it does not have that get their own line instead of "unknown flag" (flag ->
    reason; both spellings of a switch)."""

    refused: dict[str, str] = {}

    def error(self, message: str):
        hint = f"see {self.prog} --help"
        if message.startswith("argument "):
            head, _, reason = message[len("argument "):].partition(": ")
            # "-h/--help" style heads: keep the long spelling
            raise ConfigError(head.split("/")[-1], f"{reason}; {hint}")
        raise ConfigError(message, hint)

    def parse_strict(self, argv: list[str]) -> argparse.Namespace:
        """parse_args with a did-you-mean for unknown flags instead of argparse's list."""
        for token in argv:
            name = token.split("=", 1)[0]
            if name in REMOVED:
                raise ConfigError(name, REMOVED[name])
            if name in self.refused:
                raise ConfigError(name, self.refused[name])
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


def _add_field(group, f: dataclasses.Field, suppress_defaults: bool, help: str) -> None:
    md = f.metadata
    kind = f.type.replace(" | None", "")
    kw: dict = dict(help=help)
    if kind == "bool":  # a switch; --bf16 / --no-bf16 when "unset" (None) means "by device"
        kw["action"] = argparse.BooleanOptionalAction if "None" in f.type else "store_true"
    elif md["choices"] is not None:
        kw["choices"] = md["choices"]
    else:
        kw["type"], kw["metavar"] = _TYPES["str" if md["nargs"] else kind]
    if md["nargs"]:
        kw["nargs"] = md["nargs"]
    if md["metavar"]:
        kw["metavar"] = md["metavar"]
    kw["default"] = argparse.SUPPRESS if suppress_defaults else f.default
    dest = dest_of(f)
    group.add_argument("--" + dest.replace("_", "-"), dest=dest, **kw)


def _section_doc(cls, path: tuple[str, ...]) -> str | None:
    """The first paragraph of the docstring of the section at ``path``, one line."""
    for name in path:
        cls = next(f for f in dataclasses.fields(cls) if f.name == name).metadata["section"]
    return " ".join((cls.__doc__ or "").split("\n\n")[0].split()) or None


def _build(config_cls, prog: str, description: str, suppress_defaults: bool,
           only: tuple[str, ...] | None = None, helps: dict | None = None) -> OneLineParser:
    """A parser of the leaves of ``config_cls`` (``only``: these dests, in this order), one
    ``--help`` group per section path (``rollout.sampling``)."""
    parser = OneLineParser(prog=prog, description=description, allow_abbrev=False,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    groups: dict = {}
    fields = {dest_of(f): (path, f) for path, f in leaves(config_cls) if f.metadata["cli"]}
    for dest in only or fields:
        path, f = fields[dest]
        help = (helps or {}).get(dest) or help_text(f)
        if f.metadata["positional"]:
            parser.add_argument(dest, metavar=f.metadata["metavar"], help=help)
            continue
        title = ".".join(path[:-1])
        if title not in groups:
            groups[title] = parser.add_argument_group(title, _section_doc(config_cls, path[:-1]))
        _add_field(groups[title], f, suppress_defaults, help)
    return parser


def build_train_parser(prog: str = "relax train", suppress_defaults: bool = False) -> OneLineParser:
    """The ``relax train`` parser. ``suppress_defaults`` leaves unset flags out of the
    Namespace, which is how :func:`explicit_dests` sees what the user typed."""
    parser = _build(TrainConfig, prog, TRAIN_DESCRIPTION, suppress_defaults)
    parser.add_argument(
        "--config", metavar="FILE", type=text, action="append",
        default=argparse.SUPPRESS if suppress_defaults else None,
        help="Default: none. A .yaml, .toml or .json file with the sections as keys (the "
        "layout of --dry-run and of a run's config.json, which loads back to the same "
        "configuration); may be given several times: the files merge in order, a later one "
        "winning, and flags given too override them all (relax/config/files.py).")
    return parser


def build_eval_parser(suppress_defaults: bool = False) -> OneLineParser:
    """The ``relax eval CHECKPOINT`` parser (same one-line errors as ``relax train``)."""
    parser = _build(EvalConfig, "relax eval", EVAL_DESCRIPTION, suppress_defaults, EVAL_FLAGS,
                    {**EVAL_HELP, "output_dir": _EVAL_OUTPUT_HELP})
    parser.refused = {f"--{no}{dest.replace('_', '-')}": reason
                      for dest, reason in EVAL_REFUSED.items() for no in ("", "no-")}
    return parser


def explicit_dests(parser_builder, argv: list[str]) -> set[str]:
    """Fields the user passed on the command line (run after a successful full parse)."""
    ns, _ = parser_builder(suppress_defaults=True).parse_known_args(argv)
    return set(vars(ns))
