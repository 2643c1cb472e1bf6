"""How a field's default is written in ``--help`` ("Default X.", :func:`help_text`), and the
field declaration (:func:`~relax.config.section.option`) under its old import path for field
modules written before the sections. Nothing here imports torch.
"""

from __future__ import annotations

import dataclasses

from relax.config.reward_services import RM_TYPES
from relax.config.run_sections import DEVICES
from relax.config.section import derived, option

__all__ = ["DEVICES", "RM_TYPES", "default_words", "derived", "help_text", "option"]


def default_words(value) -> str:
    """A default as ``--help`` writes it: on/off, none, 1e-6, 0.2, grpo."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, float):
        mantissa, e, exponent = f"{value:g}".partition("e")
        return mantissa + (f"e{int(exponent)}" if e else "")
    return str(value)


def help_text(f: dataclasses.Field) -> str:
    """The ``--help`` text of a flag field: its default, then what it does."""
    md = f.metadata
    if md["positional"]:
        return md["help"]
    if md["default_text"] is not None:
        default = f"Default: {md['default_text']}."
    else:
        note = f" ({md['default_note']})" if md["default_note"] else ""
        default = f"Default {default_words(f.default)}{note}."
    return f"{default} {md['help']}".rstrip()
