"""Environments that misbehave on purpose (``--env tests.hostile.hostile_envs:KIND``): each
factory below builds a :class:`Misbehaving` environment of one kind; ``mixed`` plays the
kinds in turn, one per episode. ``RELAX_TEST_MARK``: a file a hanging step (or factory)
creates first, so a test knows the run is inside it; ``RELAX_TEST_CALLS``: a file each step
appends a line to, so a test counts the calls that started. In a test process,
:func:`release_hung` lets every hanging call return (the workers they hold are freed)."""

import functools
import itertools
import math
import os
import sys
import threading
import time

KINDS = ("reset_dict", "reset_none", "reset_raises", "exit0", "keyboard", "recursion", "nan",
         "inf", "pair", "surrogate", "bool_reward", "huge")
_NEXT = itertools.cycle(KINDS)


class Misbehaving:
    def __init__(self, kind: str):
        self.kind = kind

    def reset(self, seed: int):
        self.left, kind = 2, self.kind
        if kind == "mixed_":
            kind = next(_NEXT)
        self.now = kind
        if kind == "reset_dict":
            return {"observation": "go"}
        if kind == "reset_none":
            return None
        if kind == "reset_raises":
            raise ValueError("no board for this seed")
        return "go"

    def step(self, action: str):
        kind = self.now
        if os.environ.get("RELAX_TEST_CALLS"):
            with open(os.environ["RELAX_TEST_CALLS"], "a") as f:
                f.write("step\n")
        if kind in ("hang", "swallow"):
            _mark()
        if kind == "hang":
            _RELEASE.wait(3600)
        if kind == "swallow":  # catches every exception, the trainer's Interrupted included
            while True:
                try:
                    time.sleep(0.05)
                except BaseException:
                    pass
        if kind == "exit0":
            sys.exit(0)
        if kind == "keyboard":
            raise KeyboardInterrupt
        if kind == "recursion":
            return self.step(action)
        if kind in ("nan", "inf"):
            return "x", math.nan if kind == "nan" else -math.inf, False
        if kind == "huge":  # finite in float64, -inf in the float32 rewards tensor
            return "x", -1e300, False
        if kind == "pair":
            return "x", 1.0
        if kind == "surrogate":
            return "\ud800", 0.0, False
        if kind == "bool_reward":
            return "x", True, False
        if kind == "long":  # an observation of about 800 tokens of the built-in tokenizer
            return "ab " * 400, 0.0, False
        self.left -= 1
        return "T", 0.5, self.left == 0


_RELEASE = threading.Event()


def release_hung() -> None:
    """Let the hanging calls return; later ones hang again."""
    global _RELEASE
    event, _RELEASE = _RELEASE, threading.Event()
    event.set()


def _mark():
    if os.environ.get("RELAX_TEST_MARK"):
        open(os.environ["RELAX_TEST_MARK"], "w").close()


def hang_factory():
    """A factory that never returns (until released)."""
    _mark()
    _RELEASE.wait(3600)
    return Misbehaving("ok")


def exit_factory():
    """A factory that ends the process the way a script would: sys.exit(3)."""
    raise SystemExit(3)


for _kind in (*KINDS, "hang", "swallow", "long", "ok"):
    globals()[_kind] = functools.partial(Misbehaving, _kind)
mixed = functools.partial(Misbehaving, "mixed_")
