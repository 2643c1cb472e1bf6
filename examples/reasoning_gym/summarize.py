#!/usr/bin/env python3
"""The table of sweep-smollm2-reasoning-gym.sh: held-out greedy pass@1 and mean reward of the
base model and of every run at its last step, the training reward of the first and last 5
rollout steps, and each arm's mean over seeds with the seed range.

    python examples/reasoning_gym/summarize.py runs/smollm2-rg
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections import defaultdict
from statistics import mean

from relax.metrics.sinks import read_metrics

SET = "heldout"


def main(root: str) -> int:
    with open(os.path.join(root, "base", "eval_metrics.json"), encoding="utf-8") as f:
        base = json.load(f)
    base_pass = base[f"eval/{SET}/pass@1"]
    rows, arms = [], defaultdict(list)
    for name in sorted(os.listdir(root)):
        match = re.fullmatch(r"(.+)-seed(\d+)", name)
        path = os.path.join(root, name, "metrics.jsonl")
        if not match or not os.path.isfile(path):
            continue
        metrics = read_metrics(path)
        last = metrics[-1]
        if f"eval/{SET}/pass@1" not in last:
            continue  # unfinished
        rewards = [m["rollout/raw_reward"] for m in metrics]
        seconds = sum(m["perf/step_time"] + m.get("perf/eval_time", 0.0) for m in metrics)
        row = dict(arm=match[1], seed=int(match[2]), steps=len(metrics),
                   pass1=last[f"eval/{SET}/pass@1"], reward=last[f"eval/{SET}/mean_reward"],
                   first=mean(rewards[:5]), final=mean(rewards[-5:]),
                   length=last["rollout/response_length"], minutes=seconds / 60)
        rows.append(row)
        arms[row["arm"]].append(row)
    print(f"Base model: held-out greedy pass@1 {base_pass:.3f}, mean reward "
          f"{base[f'eval/{SET}/mean_reward']:.3f}\n")
    print("| arm | seed | steps | held-out pass@1 | change | train reward first 5 | last 5 "
          "| response length (last step) | minutes |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['pass1']:.3f} | "
              f"{100 * (r['pass1'] - base_pass):+.1f} pt | {r['first']:.3f} | {r['final']:.3f} | "
              f"{r['length']:.1f} | {r['minutes']:.1f} |")
    print("\n| arm | seeds | mean held-out pass@1 | change over base | seed range |")
    print("|---|---:|---:|---:|---:|")
    for arm, runs in arms.items():
        values = [r["pass1"] for r in runs]
        print(f"| {arm} | {len(runs)} | {mean(values):.3f} | "
              f"{100 * (mean(values) - base_pass):+.1f} pt | {min(values):.3f}-{max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "runs/smollm2-rg"))
