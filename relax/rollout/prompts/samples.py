"""One training or evaluation prompt, whatever its source (a data file, a built-in task, a
reasoning-gym dataset); its own module so every source can build it without importing the
others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PromptSample:
    prompt: Any  # a string, or a list of chat messages ({"role", "content"}) in data files
    label: Any
    source: str  # "file:line" (or "task:step") for error messages
    # --opd-type self: the row's --opsd-privileged-info-key value, shown only to the teacher
    privileged: str | None = None
