"""The ``relax`` command line: ``relax train``, ``relax eval``, ``relax export`` and
``relax plot``.

Thin by design: parse and validate through :mod:`relax.config`, then hand the
resolved configuration to the trainer. Heavy libraries are imported only after a
configuration is accepted and is not a dry run, so rejections and ``--dry-run`` stay fast
and load no model. Every rejection is one stderr line and exit status 2.

Adding a subcommand is one function ``_run_<name>(argv) -> int`` and one ``COMMANDS`` entry.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from relax import __version__
from relax.config import (
    ConfigError,
    config_to_json,
    parse_eval_config,
    parse_train_config,
    write_config,
)
from relax.config.flags import OneLineParser
from relax.config.section import written_dirs
from relax.errors import InputError
from relax.plotting import PlotError, parse_plot_args, plot_runs
from relax.rundirs import claim_eval_dir, claim_train_dirs


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    run: Callable[[list[str]], int]


def _error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _run_train(argv: list[str]) -> int:
    try:
        cfg = parse_train_config(argv)
    except ConfigError as e:
        return _error("relax train", str(e))
    if cfg.run.dry_run:
        print(config_to_json(cfg))
        return 0
    # Under torchrun every rank parses the same flags; rank 0 claims the directories (checks,
    # locks them for this process's lifetime) and writes config.json.
    if os.environ.get("RANK", "0") == "0":
        try:
            claim_train_dirs(written_dirs(cfg), load=cfg.checkpoint.load, models={
                "--hf-checkpoint": cfg.model.hf_checkpoint, "--ref-load": cfg.model.ref_load})
        except InputError as e:
            return _error("relax train", str(e))
        write_config(cfg)
    from relax.trainer import train  # lazy: pulls in torch and transformers

    return int(train(cfg))


def _run_eval(argv: list[str]) -> int:
    try:
        cfg = parse_eval_config(argv)
    except ConfigError as e:
        return _error("relax eval", str(e))
    try:
        claim_eval_dir(cfg.run.output_dir, cfg.checkpoint)
    except InputError as e:
        return _error("relax eval", str(e))
    from relax.eval.command import run_eval_command  # lazy: torch and transformers

    return int(run_eval_command(cfg))


def _export_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="relax export", description="Write the model of a training checkpoint (a "
        "rollout_NNNNNN directory, or a --save directory: its newest complete checkpoint) as "
        "a Hugging Face directory (safetensors) that --hf-checkpoint and relax eval load. "
        "Runs in one process; only the model is read, never the optimizer state.")
    parser.add_argument("checkpoint", metavar="CHECKPOINT")
    parser.add_argument("output_dir", metavar="OUTPUT_DIR", help="a new or empty directory")
    return parser


def _run_export(argv: list[str]) -> int:
    try:
        ns = _export_parser().parse_strict(argv)
    except ConfigError as e:
        return _error("relax export", str(e))
    if not os.path.isdir(ns.checkpoint):
        return _error("relax export", f"CHECKPOINT {ns.checkpoint}: no such directory")
    from relax.trainer.state.export import export_checkpoint  # lazy: torch and transformers

    try:
        ckpt, step = export_checkpoint(ns.checkpoint, ns.output_dir)
    except InputError as e:
        return _error("relax export", str(e))
    print(f"relax export: wrote {ns.output_dir} (the model of {ckpt}, rollout step {step})")
    return 0


def _run_plot(argv: list[str]) -> int:
    try:
        ns = parse_plot_args(argv)
        drawn = plot_runs(ns.run_dirs, ns.output, panels=ns.panels, smooth=ns.smooth,
                          title=ns.title, dpi=ns.dpi)
    except (ConfigError, PlotError) as e:
        return _error("relax plot", str(e))
    print(f"relax plot: wrote {ns.output} ({len(drawn)} panels: {', '.join(drawn)})")
    return 0


COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("train", "train a policy (relax train --help lists the flags)", _run_train),
        Command("eval", "evaluate a saved checkpoint: pass@k and mean reward", _run_eval),
        Command("export", "write a checkpoint's model as a Hugging Face directory",
                _run_export),
        Command("plot", "draw training curves of one or more runs into an image", _run_plot),
    )
}


def _top_parser() -> argparse.ArgumentParser:
    """Only for ``relax --help``: the subcommands and their summaries."""
    parser = argparse.ArgumentParser(
        prog="relax", description="Relax: RL post-training for language models "
        "(REINFORCE++, REINFORCE++-baseline, GRPO, GSPO, SAPO).")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for c in COMMANDS.values():
        sub.add_parser(c.name, help=c.summary)
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``relax`` console script; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv:
        return _error("relax", f"a command is required: {', '.join(COMMANDS)} (relax --help)")
    if argv[0] in ("-h", "--help"):
        _top_parser().print_help()
        return 0
    if argv[0] == "--version":
        print(f"relax {__version__}")
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        return _error("relax", f"{argv[0]}: unknown command; choose from "
                      f"{', '.join(COMMANDS)} (relax --help)")
    try:
        return command.run(argv[1:])
    except SystemExit as e:  # argparse --help inside a subcommand
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
