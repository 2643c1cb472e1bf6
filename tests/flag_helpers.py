"""Helpers the flag tests share (kept out of the package: only tests use them)."""

from __future__ import annotations

import argparse

from relax.config.flags import build_train_parser


def train_flags() -> dict[str, argparse.Action]:
    """Long flag name -> action of ``relax train`` (``--config`` included)."""
    # the first long name: --bf16 for the pair --bf16 / --no-bf16
    return {a.option_strings[0]: a for a in build_train_parser()._actions
            if a.option_strings and a.dest != "help"}
