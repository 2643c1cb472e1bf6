#!/usr/bin/env python3
"""Which phase of a ``relax train`` step sets the process's peak memory (issue 28 item 3).

Runs ``relax train`` in this process with the trainer's phase timer (relax/trainer/runtime.py)
wrapped: at every phase boundary the kernel's peak RSS (VmHWM) is folded into each open
phase's peak and reset (``5 > /proc/self/clear_refs``, Linux >= 4.0), so each phase gets its
own high-water mark, nested phases included. Inside the update the backward passes and the
optimizer steps get regions of their own (``update.backward``, ``update.optimizer``; the
rest of ``update`` is the forward and the loss). Prints, per rollout step, the RSS when the
step starts (what the process keeps between steps) and each phase's peak in GiB.

    python benchmarks/memory_by_phase.py -- --hf-checkpoint models/SmolLM2-135M-Instruct ...

The resets make an outside observer of this process (``/usr/bin/time``, a parent's
``ru_maxrss``) see less than the true peak: that is why this lives here and not in the
trainer. CPU only (on CUDA ``perf/peak_memory_gb`` is the allocator's, reset per phase by
``torch.cuda.reset_peak_memory_stats`` in a profiler of one's own). Results:
docs/performance.md, "What sets the peak".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import defaultdict

GIB_PER_KB = 1 / 2**20
TRIM = None
if os.environ.get("TRIM"):
    import ctypes
    TRIM = ctypes.CDLL("libc.so.6").malloc_trim


def status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


class Watermarks:
    """Per-region peaks of VmHWM; ``region`` nests, each boundary folds and resets."""

    def __init__(self):
        self.open: list[str] = []
        self.step = 0
        self.peaks: dict[int, dict[str, float]] = defaultdict(dict)
        self.at_start: dict[int, float] = {}

    def fold(self) -> None:
        if TRIM:
            TRIM(0)
        hwm = status_kb("VmHWM") * GIB_PER_KB
        for name in self.open:
            peaks = self.peaks[self.step]
            peaks[name] = max(peaks.get(name, 0.0), hwm)
        self.peaks[self.step]["run"] = max(self.peaks[self.step].get("run", 0.0), hwm)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    @contextlib.contextmanager
    def region(self, name: str):
        self.fold()
        if name == "step":
            self.step += 1
            self.at_start[self.step] = status_kb("VmRSS") * GIB_PER_KB
        self.open.append(name)
        try:
            yield
        finally:
            self.fold()
            self.open.remove(name)


def install(marks: Watermarks) -> None:
    import torch
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)

    from relax.trainer import runtime

    timed = runtime.Timer.__call__

    @contextlib.contextmanager
    def phase(self, name):
        with marks.region(name), timed(self, name):
            yield

    runtime.Timer.__call__ = phase
    backward = torch.autograd.backward

    def tracked_backward(*args, **kwargs):
        inside = "update" in marks.open
        with marks.region("update.backward") if inside else contextlib.nullcontext():
            return backward(*args, **kwargs)

    torch.autograd.backward = tracked_backward
    opened = []

    def pre(*_):
        opened.append(marks.region("update.optimizer"))
        opened[-1].__enter__()

    def post(*_):
        opened.pop().__exit__(None, None, None)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the table here")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    argv = [a for a in args.train_args if a != "--"]
    marks = Watermarks()
    install(marks)
    from relax.cli import main as relax_main

    rc = relax_main(["train", *argv])
    order = ["run", "step", "rollout", "generate", "reward", "train", "log_prob", "advantage",
             "update", "update.backward", "update.optimizer", "eval"]
    print("\n| step | RSS at start | " + " | ".join(order) + " |")
    print("|---:|---:|" + "---:|" * len(order))
    for step in sorted(marks.peaks):
        p = marks.peaks[step]
        cells = [f"{p[k]:.2f}" if k in p else "" for k in order]
        print(f"| {step or 'load'} | {marks.at_start.get(step, 0.0):.2f} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks": marks.peaks, "rss_at_step_start": marks.at_start}, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
