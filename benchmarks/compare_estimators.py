"""Same-budget comparison on the CPU: 3 arms x 3 seeds on the built-in task and model.

Not part of the test suite. Regenerates the numbers and images of
``docs/reports/reinforce-plus-plus-validation.md``::

    .venv/bin/python benchmarks/compare_estimators.py            # ~30 min on 2 cores

Arms (reinforce_plus_plus.md §8 recipes; everything else is the built-in preset of
``relax/config/presets.py``, so the three arms share one budget: the same prompts per step,
samples per prompt, steps, response length and learning rate):

* ``reinforce_plus_plus``: --normalize-advantages --gamma 1.0 --kl-coef 0.01 --kl-loss-type k1
* ``reinforce_plus_plus_baseline``: --normalize-advantages --n-samples-per-prompt 8 --kl-coef 0
  --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01
* ``grpo``: its defaults plus --n-samples-per-prompt 8

Each run is ``relax train`` in its own process, one at a time (the cores are shared; timing
several at once would measure contention), saving its final model, then ``relax eval`` of
that model on the task's fixed 64 evaluation prompts. A run directory whose metrics.jsonl is
already complete is reused, so an interrupted sweep continues where it stopped. The summary
(every run and the across-seed mean and sample std) goes to ``--summary`` as JSON and to
stdout as markdown tables; the curves go to ``--images``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ARMS = {
    "reinforce_plus_plus": ["--advantage-estimator", "reinforce_plus_plus",
                            "--normalize-advantages", "--gamma", "1.0", "--kl-coef", "0.01",
                            "--kl-loss-type", "k1"],
    "reinforce_plus_plus_baseline": ["--advantage-estimator", "reinforce_plus_plus_baseline",
                                     "--normalize-advantages", "--n-samples-per-prompt", "8",
                                     "--kl-coef", "0", "--use-kl-loss", "--kl-loss-type", "k2",
                                     "--kl-loss-coef", "0.01"],
    "grpo": ["--advantage-estimator", "grpo", "--n-samples-per-prompt", "8"],
}
SEEDS = (42, 1234, 2026)
LAST = 10  # the "last-10-step" window of the report
EVAL_SAMPLES = 8
IMAGES = {  # file -> (panels, smoothing window)
    "reward.png": (["reward", "returns", "response_length"], 5),
    "advantages.png": (["advantage_raw", "advantage_normalized"], 5),
    "losses_kl.png": (["pg_loss", "kl_loss", "ppo_kl", "clipfrac", "grad_norm", "throughput"],
                      5),
}


def relax(*args: str, log: str | None = None) -> float:
    """Run ``python -m relax ARGS`` to completion; return its wall time in seconds."""
    start = time.perf_counter()
    if log:
        os.makedirs(os.path.dirname(os.path.abspath(log)), exist_ok=True)
    with open(log or os.devnull, "w", encoding="utf-8") as f:
        proc = subprocess.run([sys.executable, "-m", "relax", *args], stdout=f,
                              stderr=subprocess.STDOUT)
    if proc.returncode:
        raise SystemExit(f"relax {' '.join(args[:2])} ... failed with status "
                         f"{proc.returncode}; see {log}")
    return time.perf_counter() - start


def read_metrics(run_dir: str) -> list[dict]:
    """Rows of metrics.jsonl, one per step (a later row for a step wins)."""
    rows = {}
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                rows[row["rollout/step"]] = row
    return [rows[s] for s in sorted(rows)]


def complete(run_dir: str, steps: int) -> bool:
    try:
        return len(read_metrics(run_dir)) == steps and os.path.isfile(
            os.path.join(run_dir, "eval_metrics.json"))
    except (OSError, json.JSONDecodeError, KeyError):
        return False


def _mean(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.fmean(values) if values else None


def summarize_run(run_dir: str, timing: dict | None) -> dict:
    rows = read_metrics(run_dir)
    last, warm = rows[-LAST:], rows[1:]  # step 1 pays one-off start-up costs
    with open(os.path.join(run_dir, "eval_metrics.json"), encoding="utf-8") as f:
        ev = json.load(f)
    task = next(k.split("/")[1] for k in ev if k.startswith("eval/"))
    return {
        "steps": len(rows),
        "reward_first10": _mean(rows[:LAST], "rollout/raw_reward"),
        "reward_last10": _mean(last, "rollout/raw_reward"),
        "returns_last10": _mean(last, "rollout/returns"),
        "adv_raw_mean": _mean(rows, "rollout/advantage_raw_mean"),
        "adv_raw_std": _mean(rows, "rollout/advantage_raw_std"),
        "adv_norm_mean": _mean(rows, "rollout/advantage_normalized_mean"),
        "adv_norm_std": _mean(rows, "rollout/advantage_normalized_std"),
        "zero_variance_steps": sum(r.get("rollout/advantage_zero_variance") == 1.0
                                   for r in rows),
        "ppo_kl_mean": _mean(rows, "train/ppo_kl"),
        "ppo_kl_max_abs": max(abs(r["train/ppo_kl"]) for r in rows),
        "kl_loss_last10": _mean(last, "train/kl_loss"),
        "clipfrac_mean": _mean(rows, "train/pg_clipfrac"),
        "grad_norm_mean": _mean(rows, "train/grad_norm"),
        "entropy_last10": _mean(last, "train/entropy"),
        "response_length_last10": _mean(last, "rollout/response_length"),
        "step_time_median_s": statistics.median(r["perf/step_time"] for r in warm),
        "tokens_per_s_median": statistics.median(r["perf/generated_tokens_per_s"]
                                                 for r in warm),
        "peak_memory_gb": max(r["perf/peak_memory_gb"] for r in rows),
        "wall_s": (timing or {}).get("wall_s"),
        "load1_before": (timing or {}).get("load1_before"),
        "load1_after": (timing or {}).get("load1_after"),
        "eval_pass@1": ev[f"eval/{task}/pass@1"],
        f"eval_pass@{EVAL_SAMPLES}": ev[f"eval/{task}/pass@{EVAL_SAMPLES}"],
        "eval_mean_reward": ev[f"eval/{task}/mean_reward"],
    }


def aggregate(runs: dict[int, dict]) -> dict[str, dict[str, float | None]]:
    """Across seeds: mean and sample standard deviation (ddof = 1) of every number."""
    out = {}
    for key in next(iter(runs.values())):
        values = [r[key] for r in runs.values() if r[key] is not None]
        if not values:
            out[key] = {"mean": None, "std": None}
            continue
        out[key] = {"mean": statistics.fmean(values),
                    "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    return out


def fmt(cell: dict, spec: str = ".3f") -> str:
    if cell["mean"] is None:
        return "n/a"
    return f"{cell['mean']:{spec}} ± {cell['std']:{spec}}"


def tables(summary: dict) -> str:
    arms = summary["arms"]
    columns = [
        ("Reward and evaluation", [
            ("reward, first 10 steps", "reward_first10", ".3f"),
            ("reward, last 10 steps", "reward_last10", ".3f"),
            (f"eval pass@1 ({EVAL_SAMPLES} samples x 64 prompts)", "eval_pass@1", ".3f"),
            (f"eval pass@{EVAL_SAMPLES}", f"eval_pass@{EVAL_SAMPLES}", ".3f"),
            ("eval mean reward", "eval_mean_reward", ".3f"),
            ("response length, last 10", "response_length_last10", ".2f"),
            ("entropy, last 10", "entropy_last10", ".3f")]),
        ("Advantage moments (mean over steps)", [
            ("raw mean", "adv_raw_mean", ".4f"), ("raw std", "adv_raw_std", ".4f"),
            ("normalized mean", "adv_norm_mean", ".2e"),
            ("normalized std", "adv_norm_std", ".4f"),
            ("zero-variance steps", "zero_variance_steps", ".1f")]),
        ("KL observables and update", [
            ("rollout/returns, last 10", "returns_last10", ".4f"),
            ("train/kl_loss (k2), last 10", "kl_loss_last10", ".2e"),
            ("train/ppo_kl, mean", "ppo_kl_mean", ".2e"),
            ("train/ppo_kl, max abs", "ppo_kl_max_abs", ".2e"),
            ("train/pg_clipfrac, mean", "clipfrac_mean", ".4f"),
            ("train/grad_norm, mean", "grad_norm_mean", ".3f")]),
        ("Cost", [
            ("step time, median (s)", "step_time_median_s", ".3f"),
            ("generated tokens/s, median", "tokens_per_s_median", ".0f"),
            ("peak memory (GiB, RSS)", "peak_memory_gb", ".3f"),
            ("wall time per run (s)", "wall_s", ".0f"),
            ("1-min load average after the run", "load1_after", ".2f")]),
    ]
    lines = []
    for title, rows in columns:
        seeds = ", ".join(map(str, summary["seeds"]))
        lines += [f"**{title}** (mean ± sample std over seeds {seeds})", "",
                  "| | " + " | ".join(f"`{a}`" for a in arms) + " |",
                  "|---|" + "---|" * len(arms)]
        for label, key, spec in rows:
            lines.append(f"| {label} | " + " | ".join(
                fmt(arms[a]["aggregate"][key], spec) for a in arms) + " |")
        lines.append("")
    if "timing" in summary:
        t = summary["timing"]
        lines += ["**Interleaved timing pass** (median over rounds of each run's median)", "",
                  "| | " + " | ".join(f"`{a}`" for a in t) + " |", "|---|" + "---|" * len(t)]
        for label, key, spec in (("step time (s)", "step_time_median_s", ".3f"),
                                 ("rollout time (s)", "rollout_time_median_s", ".3f"),
                                 ("train time (s)", "train_time_median_s", ".3f"),
                                 ("generated tokens/s", "tokens_per_s_median", ".0f")):
            lines.append(f"| {label} | " + " | ".join(
                f"{t[a][key]:{spec}}" for a in t) + " |")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="runs/compare_estimators")
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    parser.add_argument("--images", default="docs/reports/images")
    parser.add_argument("--summary", default="docs/reports/compare_estimators.json")
    parser.add_argument("--num-rollout", type=int, default=None,
                        help="default: the preset's; smaller only for a smoke test")
    parser.add_argument("--num-steps-per-rollout", type=int, default=None,
                        help="variant: N optimizer steps per rollout step (global batch = "
                             "samples / N); outputs get the suffix _stepsN")
    parser.add_argument("--timing-rounds", type=int, default=0,
                        help="extra timing pass: R rounds of every arm, interleaved "
                             "round-robin so load changes hit all arms alike")
    parser.add_argument("--timing-steps", type=int, default=40)
    parser.add_argument("--skip-train", action="store_true",
                        help="only summarize and plot existing runs")
    args = parser.parse_args()

    from relax.config import BUILTIN_PRESET
    from relax.plotting import plot_runs

    steps = args.num_rollout or BUILTIN_PRESET["num_rollout"]
    variant = []
    suffix = ""
    if args.num_steps_per_rollout:
        variant = ["--num-steps-per-rollout", str(args.num_steps_per_rollout)]
        suffix = f"_steps{args.num_steps_per_rollout}"
        args.root += suffix
        args.summary = args.summary.replace(".json", f"{suffix}.json")
    budget = (["--num-rollout", str(steps)] if args.num_rollout else []) + variant
    walls_path = os.path.join(args.root, "wall_times.json")
    walls = {}
    if os.path.isfile(walls_path):
        with open(walls_path, encoding="utf-8") as f:
            walls = json.load(f)
    run_dirs: dict[str, dict[int, str]] = {}
    for arm in args.arms:
        for seed in args.seeds:
            run = os.path.join(args.root, f"{arm}-seed{seed}")
            run_dirs.setdefault(arm, {})[seed] = run
            if args.skip_train or complete(run, steps):
                continue
            shutil.rmtree(run, ignore_errors=True)
            print(f"[{time.strftime('%H:%M:%S')}] {arm} seed {seed}", flush=True)
            load_before = os.getloadavg()[0]
            wall = relax("train", *ARMS[arm], *budget, "--seed", str(seed), "--output-dir", run,
                               "--save", os.path.join(run, "checkpoint"),
                               log=run + ".train.log")
            # other processes on the shared cores distort the timings: keep the evidence
            walls[run] = {"wall_s": wall, "load1_before": load_before,
                          "load1_after": os.getloadavg()[0]}
            relax("eval", os.path.join(run, "checkpoint"), "--n-samples-per-eval-prompt",
                  str(EVAL_SAMPLES), "--seed", str(seed), "--output-dir", run,
                  log=run + ".eval.log")
            with open(walls_path, "w", encoding="utf-8") as f:
                json.dump(walls, f, indent=2)

    summary = {
        "preset": BUILTIN_PRESET, "num_rollout": steps, "extra_flags": budget, "seeds": args.seeds, "arm_flags": {a: ARMS[a] for a in args.arms},
        "last_window": LAST, "eval_samples_per_prompt": EVAL_SAMPLES,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "torch": __import__("torch").__version__},
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "arms": {},
    }
    if not args.timing_rounds and os.path.isfile(args.summary):
        with open(args.summary, encoding="utf-8") as f:  # keep an earlier timing pass
            earlier = json.load(f).get("timing")
        if earlier:
            summary["timing"] = earlier
    for arm, seeds in run_dirs.items():
        runs = {s: summarize_run(d, walls.get(d)) for s, d in seeds.items()}
        summary["arms"][arm] = {"runs": runs, "aggregate": aggregate(runs)}
    os.makedirs(os.path.dirname(os.path.abspath(args.summary)), exist_ok=True)
    with open(args.summary, "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
    os.makedirs(args.images, exist_ok=True)
    every_run = [d for seeds in run_dirs.values() for d in seeds.values()]
    for name, (panels, smooth) in IMAGES.items():
        if suffix and name == "advantages.png":
            continue  # the variant changes the update, not the advantages
        out = os.path.join(args.images, name.replace(".png", f"{suffix}.png"))
        plot_runs(every_run, out, panels=panels, smooth=smooth,
                  title=f"built-in {BUILTIN_PRESET['builtin_task']} task, {len(args.seeds)} "
                        f"seeds per arm{' ' + ' '.join(variant) if variant else ''} "
                        f"(moving average over {smooth} steps)", dpi=70)
        shrink_png(out)
    if args.timing_rounds:
        summary["timing"] = timing_pass(args, variant)
        with open(args.summary, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2)
    print(tables(summary))
    return 0


def shrink_png(path: str) -> None:
    """Re-save with a 64-colour palette: line plots lose nothing visible, the file ~1/3."""
    from PIL import Image

    with Image.open(path) as im:
        small = im.convert("RGB").quantize(colors=64)
    small.save(path, optimize=True)


def timing_pass(args, variant: list[str]) -> dict:
    """Each arm ``--timing-steps`` steps, seed 42, ``--timing-rounds`` rounds interleaved
    round-robin; the median over rounds of each run's median step time and tokens/s."""
    per_arm = {arm: [] for arm in args.arms}
    for r in range(args.timing_rounds):
        for arm in args.arms:
            run = os.path.join(args.root, "timing", f"{arm}-round{r}")
            shutil.rmtree(run, ignore_errors=True)
            print(f"[{time.strftime('%H:%M:%S')}] timing {arm} round {r}", flush=True)
            relax("train", *ARMS[arm], *variant, "--num-rollout", str(args.timing_steps),
                  "--seed", "42", "--output-dir", run, log=run + ".log")
            warm = read_metrics(run)[1:]
            per_arm[arm].append({
                "step_time_median_s": statistics.median(x["perf/step_time"] for x in warm),
                "rollout_time_median_s": statistics.median(x["perf/rollout_time"] for x in warm),
                "train_time_median_s": statistics.median(x["perf/train_time"] for x in warm),
                "tokens_per_s_median": statistics.median(
                    x["perf/generated_tokens_per_s"] for x in warm),
            })
    return {arm: {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
            | {"rounds": rounds} for arm, rounds in per_arm.items()}


if __name__ == "__main__":
    raise SystemExit(main())
