#!/usr/bin/env python3
"""The table of a sweep: held-out greedy pass@1 and mean reward of the base model and of every
run at its last step, the training reward of the first and last 5 rollout steps, the run's
peak memory, and each arm's mean over seeds with the seed range.

    python examples/reasoning_gym/summarize.py runs/smollm2-rg             # eval/heldout/...
    python examples/reasoning_gym/summarize.py runs/smollm2-gtn --set env  # eval/env/... (--env)

Runs are the directories ``<arm>-seed<S>`` of the root; the base model's evaluation is
``base/eval_metrics.json``. For ``--env`` runs the table adds the episode turns.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import defaultdict
from statistics import mean

from relax.metrics.sinks import read_metrics


def _row(arm: str, seed: int, metrics: list[dict], key: str) -> dict | None:
    if not metrics or f"{key}/pass@1" not in metrics[-1]:
        return None  # unfinished
    last = metrics[-1]
    rewards = [m["rollout/raw_reward"] for m in metrics]
    seconds = sum(m["perf/step_time"] + m.get("perf/eval_time", 0.0) for m in metrics)
    return dict(arm=arm, seed=seed, steps=len(metrics), pass1=last[f"{key}/pass@1"],
                reward=last[f"{key}/mean_reward"], turns=last.get(f"{key}/episode_turns"),
                first=mean(rewards[:5]), final=mean(rewards[-5:]),
                length=last["rollout/response_length"], minutes=seconds / 60,
                memory=max(m.get("perf/peak_memory_gb", 0.0) for m in metrics),
                kept=sum(m.get("rollout/groups_kept", 0.0) for m in metrics),
                generated=sum(m.get("rollout/groups_generated", 0.0) for m in metrics))


def main(root: str, set_name: str) -> int:
    key = f"eval/{set_name}"
    with open(os.path.join(root, "base", "eval_metrics.json"), encoding="utf-8") as f:
        base = json.load(f)
    base_pass = base[f"{key}/pass@1"]
    rows, arms = [], defaultdict(list)
    for name in sorted(os.listdir(root)):
        match = re.fullmatch(r"(.+)-seed(\d+)", name)
        path = os.path.join(root, name, "metrics.jsonl")
        if not match or not os.path.isfile(path):
            continue
        row = _row(match[1], int(match[2]), read_metrics(path), key)
        if row is not None:
            rows.append(row)
            arms[row["arm"]].append(row)
    episodes = base.get(f"{key}/episode_turns") is not None
    turns = f", {base[f'{key}/episode_turns']:.2f} turns" if episodes else ""
    print(f"Base model: held-out greedy pass@1 {base_pass:.3f}, mean reward "
          f"{base[f'{key}/mean_reward']:.3f}{turns}\n")
    print("| arm | seed | steps | held-out pass@1 | change | mean reward |"
          + (" turns |" if episodes else "") + " train reward first 5 | last 5 "
          "| response length (last step) | peak memory GB | minutes |")
    print("|---|---:|---:|---:|---:|---:|" + ("---:|" if episodes else "") + "---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['arm']} | {r['seed']} | {r['steps']} | {r['pass1']:.3f} | "
              f"{100 * (r['pass1'] - base_pass):+.1f} pt | {r['reward']:.3f} | "
              + (f"{r['turns']:.2f} | " if episodes else "")
              + f"{r['first']:.3f} | {r['final']:.3f} | {r['length']:.1f} | "
              f"{r['memory']:.2f} | {r['minutes']:.1f} |")
    print("\n| arm | seeds | mean held-out pass@1 | change over base | seed range |")
    print("|---|---:|---:|---:|---:|")
    for arm, runs in arms.items():
        values = [r["pass1"] for r in runs]
        print(f"| {arm} | {len(runs)} | {mean(values):.3f} | "
              f"{100 * (mean(values) - base_pass):+.1f} pt | {min(values):.3f}-{max(values):.3f} |")
    if any(r["generated"] for r in rows):
        print("\n| arm | seed | groups generated | groups kept |")
        print("|---|---:|---:|---:|")
        for r in rows:
            if r["generated"]:
                print(f"| {r['arm']} | {r['seed']} | {r['generated']:.0f} | {r['kept']:.0f} |")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="runs/smollm2-rg")
    parser.add_argument("--set", default="heldout", dest="set_name",
                        help="the evaluation set: heldout (default) or env for --env runs")
    args = parser.parse_args()
    sys.exit(main(args.root, args.set_name))
