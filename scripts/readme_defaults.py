"""The README's "built-in default, measured" table, from runs, never typed by hand.

    .venv/bin/python scripts/readme_defaults.py            # run the recipes, rewrite the table
    .venv/bin/python scripts/readme_defaults.py --check    # run them, exit 1 if the table differs

Each recipe is ``relax train [recipe flags]`` in its own process, one at a time (timing two at
once would measure contention), at ``OMP_NUM_THREADS=2``: the thread count ``make demo`` uses
on the 2-core machines the README describes, and the one the rewards are promised at (a seeded
run repeats bit for bit at a given thread count, idle or busy; another count sums in another
order). The table sits between the two ``readme-defaults`` markers of README.md; the rewards
are the mean of ``rollout/raw_reward`` over the first and the last 5 rollout steps, the wall
time that of the whole command. tests/reliability/test_repeat_under_load.py runs the
``make demo`` row's recipe and fails when its rewards are not the README's, so a number that
goes stale fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BEGIN, END = "<!-- readme-defaults:begin -->", "<!-- readme-defaults:end -->"
THREADS = "2"
# (row label, flags): the contract recipes of README "Running" on the built-in preset
RECIPES = (
    ("`grpo` (no flags: `make demo`)", []),
    ("`reinforce_plus_plus` (contract recipe above)",
     ["--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages", "--gamma", "1.0",
      "--kl-coef", "0.01", "--kl-loss-type", "k1"]),
    ("`reinforce_plus_plus_baseline` (contract recipe above)",
     ["--advantage-estimator", "reinforce_plus_plus_baseline", "--normalize-advantages",
      "--n-samples-per-prompt", "8", "--kl-coef", "0", "--use-kl-loss", "--kl-loss-type", "k2",
      "--kl-loss-coef", "0.01"]),
)
DEMO = RECIPES[0]


def train_command(flags: list[str], output_dir: str) -> list[str]:
    return [sys.executable, "-m", "relax", "train", *flags, "--output-dir", output_dir]


def train_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": THREADS}


def rewards(output_dir: str | Path) -> tuple[float, float]:
    """(mean raw reward of the first 5 rollout steps, of the last 5) of a finished run."""
    with open(Path(output_dir) / "metrics.jsonl", encoding="utf-8") as f:
        values = [json.loads(line)["rollout/raw_reward"] for line in f]
    if len(values) < 5:
        raise SystemExit(f"{output_dir}/metrics.jsonl: {len(values)} steps, fewer than 5")
    return sum(values[:5]) / 5, sum(values[-5:]) / 5


def cpu_kind() -> str:
    """What decides the order a CPU sums in, in one line: the vendor (MKL, which does the
    matrix products, picks its code path by vendor and instruction set), torch's kernel level
    (the vector width of its reductions and elementwise kernels) and the vector instruction
    sets the CPU offers, and the torch version. A seeded run repeats bit for bit on one kind;
    two kinds sum in different orders and give different, equally repeatable, rewards: the
    same recipe gave a last-5 reward of 0.184 on the machine that first wrote the table and
    0.231 on an AMD EPYC with AVX2 and no AVX-512 (transformers 5.24 and 5.25 alike)."""
    import platform

    import torch

    vendor, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "vendor_id":
                    vendor = value.strip()
                elif key.strip() in ("flags", "Features"):  # x86, arm64
                    flags |= set(value.split())
    except OSError:  # not Linux: the vendor string and torch's kernel level only
        pass
    isa = sorted(f for f in flags if re.match(r"(avx|fma|amx|f16c|sve|asimd)", f))
    return (f"{vendor}, torch {torch.__version__.split('+')[0]} "
            f"{torch.backends.cpu.get_cpu_capability()} kernels, {' '.join(isa) or 'no vector flags'}")


def table_cpu(text: str) -> str | None:
    """The CPU kind README's table was measured on, as its note names it (None: not named)."""
    body = text.split(BEGIN, 1)[-1].split(END, 1)[0]
    found = re.search(r"CPU: `([^`]+)`", body)
    return found.group(1) if found else None


def row(label: str, first: float, last: float, seconds: float) -> str:
    return f"| {label} | {first:.3f} | {last:.3f} | {seconds:.0f} s |"


def table_rows(text: str) -> dict[str, tuple[str, str]]:
    """README's table rows by label: (first-5, last-5) as written."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{README}: the {BEGIN} / {END} markers are missing")
    body = text.split(BEGIN, 1)[1].split(END, 1)[0]
    found = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+\.\d{3}", cells[1]):
            found[cells[0]] = (cells[1], cells[2])
    return found


def measure(label: str, flags: list[str], root: str) -> str:
    out = os.path.join(root, re.sub(r"\W+", "_", label).strip("_"))
    start = time.perf_counter()
    proc = subprocess.run(train_command(flags, out), env=train_env(), capture_output=True,
                          text=True)
    seconds = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"relax train {' '.join(flags)} failed:\n{proc.stderr[-2000:]}")
    return row(label, *rewards(out), seconds)


def commit() -> str:
    proc = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return proc.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="compare the rewards with README.md instead of rewriting it")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="readme-defaults-") as root:
        rows = [measure(label, flags, root) for label, flags in RECIPES]
    text = README.read_text(encoding="utf-8")
    if args.check:
        if table_cpu(text) != cpu_kind():
            print(f"README.md's table was measured on CPU {table_cpu(text)!r}, this is "
                  f"{cpu_kind()!r}: another kind sums in another order, nothing to compare")
            return 1
        want = table_rows(text)
        got = table_rows(f"{BEGIN}\n" + "\n".join(rows) + f"\n{END}")
        stale = [label for label in got if want.get(label) != got[label]]
        for label in stale:
            print(f"README.md: {label}: {want.get(label)} written, {got[label]} measured")
        return 1 if stale else 0
    header = "| recipe | first 5 steps | last 5 steps | wall time |\n|---|---:|---:|---:|"
    load = os.getloadavg()[1]  # the 5-minute mean: other work slows the wall times, never the rewards
    note = (f"(Seed 1234, {THREADS} intra-op threads, commit {commit()}, load average {load:.1f} "
            f"on {os.cpu_count()} cores, CPU: `{cpu_kind()}`; `scripts/readme_defaults.py` wrote this "
            f"table.)")
    block = f"{BEGIN}\n{header}\n" + "\n".join(rows) + f"\n\n{note}\n{END}"
    README.write_text(re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text,
                             flags=re.S), encoding="utf-8")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
