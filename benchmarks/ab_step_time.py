"""End-to-end step time and memory of two variants of a Relax run, side by side (A, B, A, B).

Not part of the test suite. A variant is a code state (a directory holding a checkout, e.g.
``git worktree add /tmp/relax-a COMMIT``; every run starts ``python -m relax train`` with it as
the working directory, so it imports that state's ``relax``) plus optional extra flags
(``--a-flags`` / ``--b-flags``). Per run the median over steps 2..N (step 1 pays warm-up) of
every ``perf/*`` metric is taken (``perf/peak_memory_gb`` is the process's peak); the table
gives the median of those over the repeats::

    .venv/bin/python benchmarks/ab_step_time.py --a /tmp/relax-before --b . --repeats 2 \\
        -- --hf-checkpoint models/SmolLM2-135M-Instruct --num-rollout 4 ...
    .venv/bin/python benchmarks/ab_step_time.py --a . --b . --b-flags "--lora-rank 16" -- ...

Everything after ``--`` is passed to both runs of ``relax train`` (give ``--num-rollout``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
    keys = sorted(k for k in rows[0] if k.startswith("perf/"))
    return {k: statistics.median(r[k] for r in rows if r.get(k) is not None) for k in keys}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="directory of state A (before)")
    ap.add_argument("--b", required=True, help="directory of state B (after)")
    ap.add_argument("--a-flags", default="", help="extra relax train flags of A")
    ap.add_argument("--b-flags", default="", help="extra relax train flags of B")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workdir", default=tempfile.gettempdir())
    ap.add_argument("flags", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    flags = [f for f in args.flags if f != "--"]
    results = {"A": [], "B": []}
    start = time.time()
    for i in range(args.repeats):
        for name, state, extra in (("A", args.a, args.a_flags), ("B", args.b, args.b_flags)):
            results[name].append(run_once(state, flags + shlex.split(extra), args.workdir))
            print(f"repeat {i + 1} {name}: step {results[name][-1]['perf/step_time']:.2f} s",
                  file=sys.stderr)
    keys = sorted(set(results["A"][0]) & set(results["B"][0]))
    print(f"| metric (median of {args.repeats} runs, steps 2..N) | A | B | B / A |")
    print("|---|---:|---:|---:|")
    for k in keys:
        a = statistics.median(r[k] for r in results["A"])
        b = statistics.median(r[k] for r in results["B"])
        print(f"| {k} | {a:.3f} | {b:.3f} | {b / a if a else float('nan'):.3f} |")
    print(f"wall {time.time() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
