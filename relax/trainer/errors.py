"""The one exception type that reaches the user as a single line.

``relax.trainer.train`` catches :class:`RelaxError`, prints
``relax train: error: <message>`` on stderr and returns ``exit_code``:

- 2 for bad input found before training starts (missing model directory or data file, a
  malformed data row, an empty dataset, an unusable ``--save`` directory) -- the same status as a
  rejected configuration;
- 1 for a failure during training (a reward function that raises or returns bad values, a
  non-finite loss or gradient norm).
"""

from __future__ import annotations


class RelaxError(Exception):
    """A user-facing failure; ``str(e)`` is the whole one-line message."""

    exit_code = 1


class InputError(RelaxError):
    """Bad input detected before anything is trained (exit status 2)."""

    exit_code = 2


class RewardError(RelaxError):
    """A reward function raised, returned the wrong count or a non-finite value."""


class NonFiniteError(RelaxError):
    """A non-finite loss or gradient norm; raised before the optimizer step."""
