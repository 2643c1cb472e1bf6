#!/usr/bin/env python3
"""Where a ``relax train`` step spends its time and which part sets its peak memory: seconds
and peak RSS per phase, and inside the phases.

Runs ``relax train`` in this process with regions around:

- the trainer's phases (relax/trainer/runtime.py ``Timer``: step, rollout, generate, reward,
  train, log_prob, advantage, update, eval);
- ``log_prob.reference``: the frozen reference's pass (``Policy.ref_log_probs``; the rest of
  ``log_prob`` is pi_old's);
- inside ``update``: ``update.forward`` (``micro_batch_loss``: the forward, the chunked output
  layer and the loss), ``update.backward`` (with the recompute of the checkpointed layers and
  head chunks) and ``update.optimizer`` (``optimizer.step``).

Memory: at every region boundary the kernel's peak RSS (VmHWM) is folded into each open
region's peak and reset (``5 > /proc/self/clear_refs``, Linux >= 4.0), so each region gets its
own high-water mark, nested regions included. ``RSS at start`` is what the process keeps
between steps. The resets make an outside observer (``/usr/bin/time``, a parent's
``ru_maxrss``) see less than the true peak: that is why this lives here and not in the
trainer. Linux only.

    python benchmarks/profile_step.py --json out.json -- --hf-checkpoint models/... [flags]

Results: docs/performance.md, "What sets the peak" and "Where a long step goes".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import defaultdict

GIB_PER_KB = 1 / 2**20
ORDER = ("step", "generate", "reward", "log_prob", "log_prob.reference", "advantage", "update",
         "update.forward", "update.backward", "update.optimizer", "eval")


def status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


class Profile:
    """Per step: seconds and peak RSS (GiB) of each region; regions nest."""

    def __init__(self):
        self.open: list[str] = []
        self.step = 0
        self.peaks: dict[int, dict[str, float]] = defaultdict(dict)
        self.seconds: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.at_start: dict[int, float] = {}

    def fold(self) -> None:
        hwm = status_kb("VmHWM") * GIB_PER_KB
        peaks = self.peaks[self.step]
        for name in [*self.open, "run"]:
            peaks[name] = max(peaks.get(name, 0.0), hwm)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    @contextlib.contextmanager
    def region(self, name: str):
        self.fold()
        if name == "step":
            self.step += 1
            self.at_start[self.step] = status_kb("VmRSS") * GIB_PER_KB
        self.open.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[self.step][name] += time.perf_counter() - start
            self.fold()
            self.open.remove(name)

    def wrap(self, owner, attr: str, name: str, *, inside: str | None = None) -> None:
        """``owner.attr`` (a function or method) runs in region ``name`` (only while region
        ``inside`` is open, when given)."""
        original = getattr(owner, attr)

        def wrapped(*args, **kwargs):
            if inside is not None and inside not in self.open:
                return original(*args, **kwargs)
            with self.region(name):
                return original(*args, **kwargs)

        setattr(owner, attr, wrapped)


def install(profile: Profile) -> None:
    import torch
    from torch.optim.optimizer import (
        register_optimizer_step_post_hook,
        register_optimizer_step_pre_hook,
    )

    from relax.trainer import runtime
    from relax.trainer.policy import bundle as policy
    from relax.trainer.policy import update

    timed = runtime.Timer.__call__

    @contextlib.contextmanager
    def phase(self, name):
        with profile.region(name), timed(self, name):
            yield

    runtime.Timer.__call__ = phase
    profile.wrap(policy.Policy, "ref_log_probs", "log_prob.reference")
    profile.wrap(update, "micro_batch_loss", "update.forward", inside="update")
    profile.wrap(torch.autograd, "backward", "update.backward", inside="update")
    opened = []

    def pre(*_):
        opened.append(profile.region("update.optimizer"))
        opened[-1].__enter__()

    def post(*_):
        opened.pop().__exit__(None, None, None)

    register_optimizer_step_pre_hook(pre)
    register_optimizer_step_post_hook(post)


def table(profile: Profile) -> str:
    lines = ["| step | RSS at start (GiB) | " + " | ".join(ORDER) + " |",
             "|---:|---:|" + "---:|" * len(ORDER)]
    for step in sorted(s for s in profile.peaks if s):
        peaks, secs = profile.peaks[step], profile.seconds[step]
        cells = [f"{secs[k]:.1f} s, {peaks[k]:.2f} GiB" if k in peaks else "" for k in ORDER]
        lines.append(f"| {step} | {profile.at_start[step]:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("train_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    profile = Profile()
    install(profile)
    from relax.cli import main as relax_main

    rc = relax_main(["train", *[a for a in args.train_args if a != "--"]])
    print("\n" + table(profile))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peaks_gib": profile.peaks, "seconds": profile.seconds,
                       "rss_at_step_start_gib": profile.at_start}, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())
