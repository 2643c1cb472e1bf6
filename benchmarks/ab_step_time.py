"""End-to-end step time of two code states of Relax, side by side (A, B, A, B, ...).

Not part of the test suite. Each state is a directory holding a checkout (make one with
``git worktree add /tmp/relax-a COMMIT``); every run starts ``python -m relax train`` with that
directory as its working directory, so it imports that state's ``relax`` package. Per run the
median over steps 2..N (step 1 pays warm-up) of ``perf/step_time`` and of every
``perf/<phase>_time`` is taken; the table gives the median of those over the repeats::

    .venv/bin/python benchmarks/ab_step_time.py --a /tmp/relax-before --b . --repeats 2 \\
        -- --hf-checkpoint models/SmolLM2-135M-Instruct --num-rollout 4 ...

Everything after ``--`` is passed to ``relax train`` unchanged (give ``--num-rollout``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def run_once(state: str, flags: list[str], workdir: str) -> dict[str, float]:
    out = tempfile.mkdtemp(prefix="ab-", dir=workdir)
    env = {**os.environ, "PYTHONPATH": os.path.abspath(state)}
    subprocess.run([sys.executable, "-m", "relax", "train", *flags, "--output-dir", out],
                   cwd=state, env=env, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()][1:]  # step 1 warms up
    keys = sorted(k for k in rows[0] if k.startswith("perf/") and k.endswith("_time"))
    return {k: statistics.median(r[k] for r in rows if r.get(k) is not None) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="directory of state A (before)")
    ap.add_argument("--b", required=True, help="directory of state B (after)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("flags", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    flags = [f for f in args.flags if f != "--"]
    results = {"A": [], "B": []}
    start = time.time()
    for i in range(args.repeats):
        for name, state in (("A", args.a), ("B", args.b)):
            results[name].append(run_once(state, flags, args.workdir))
            print(f"repeat {i + 1} {name}: step {results[name][-1]['perf/step_time']:.2f} s",
                  file=sys.stderr)
    keys = sorted(set(results["A"][0]) & set(results["B"][0]))
    print(f"| metric (median of {args.repeats} runs, steps 2..N) | A s | B s | B / A |")
    print("|---|---:|---:|---:|")
    for k in keys:
        a = statistics.median(r[k] for r in results["A"])
        b = statistics.median(r[k] for r in results["B"])
        print(f"| {k} | {a:.3f} | {b:.3f} | {b / a if a else float('nan'):.3f} |")
    print(f"wall {time.time() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
