"""The exception types that reach the user as a single line (every package imports them
from here): :class:`ConfigError` for a rejected command line, :class:`RelaxError` for the rest.

``relax.trainer.train`` catches :class:`RelaxError`, prints
``relax train: error: <message>`` on stderr and returns ``exit_code``:

- 2 for bad input found before training starts (missing model directory or data file, a
  malformed data row, an empty dataset, an unusable ``--save`` directory) -- the same status as a
  rejected configuration;
- 1 for a failure during training (a reward function that raises, times out or returns bad
  values, a non-finite loss or gradient norm, a data-parallel peer that died or hangs);
- 128 + the signal number (143 SIGTERM, 130 SIGINT) when a signal stopped the run.
"""

from __future__ import annotations

import reprlib
import signal


class ConfigError(ValueError):
    """A rejected configuration: ``str(e) == "--flag VALUE: reason and what to set instead"``.

    ``flag`` is the message head (the offending flag(s), usually with their values); ``flags``
    lists just the flag names in it. The command line prints it and exits 2.
    """

    def __init__(self, flag: str, reason: str):
        flag, reason = one_line(flag), one_line(reason)
        super().__init__(f"{flag}: {reason}")
        self.flag = flag
        self.reason = reason

    @property
    def flags(self) -> list[str]:
        return [tok for tok in self.flag.split() if tok.startswith("--")]


def one_line(message: str) -> str:
    """Escape newlines and other control characters a user value may carry."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


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


class PeerFailure(RelaxError):
    """A collective failed: another rank died, hung past the timeout or lost its connection."""


class Interrupted(RelaxError):
    """SIGTERM / SIGINT stopped the run (after a checkpoint when ``--save`` is set);
    ``at_once``: by a second signal (or one during start-up), which ends the process without
    waiting for anything still running (relax/trainer/launch.py)."""

    def __init__(self, signum: int, message: str, *, at_once: bool = False):
        super().__init__(message)
        self.exit_code = 128 + int(signum)
        self.at_once = at_once


def stops_the_run(error: BaseException) -> bool:
    """Whether ``error``, caught around user code, is the trainer's stop and must propagate:
    an :class:`Interrupted` (a second SIGTERM/SIGINT, raised by the handler in whatever code
    the main thread was running), or a ``KeyboardInterrupt`` while SIGINT has Python's default
    handler (a Ctrl-C in ``relax eval``). Under ``relax train``'s handlers a
    ``KeyboardInterrupt`` can only come from the user code itself: its own failure."""
    if isinstance(error, Interrupted):
        return True
    if isinstance(error, KeyboardInterrupt):
        return signal.getsignal(signal.SIGINT) is signal.default_int_handler
    return False


def value_summary(value) -> str:
    """A bounded description of a value user code returned: type and a cut repr (deeply
    nested or huge values are cut by reprlib, a repr that raises is skipped)."""
    try:
        text = reprlib.repr(value)
    except Exception:
        text = "..."
    text = " ".join(text.split())
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def error_summary(error: BaseException) -> str:
    """``Type: message`` of an exception user code raised, on one line, cut at 200."""
    try:
        detail = " ".join(str(error).split())[:200]
    except Exception:  # a user exception whose __str__ raises
        detail = ""
    return f"{type(error).__name__}{': ' + detail if detail else ''}"


def invalid_text(value: str) -> str | None:
    """Why ``value`` is not valid Unicode text, else None. A lone surrogate comes from an
    argument or file that was not UTF-8 (Python's surrogateescape) or a JSON ``\\ud800``
    escape; tokenizers and file writers fail on it with a traceback."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"not valid UTF-8 text (character {e.start} is {value[e.start]!r}, a lone "
                "surrogate)")
    return None

