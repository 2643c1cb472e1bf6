"""Rollout corrections and length control on a real sampler-trainer mismatch
(docs/algorithms/reinforce_plus_plus.md §7c, §7d): SmolLM2-135M-Instruct on a reasoning-gym task, two seeds per
arm, one report with tables, curves and the commands.

Part ``correction``: ``--fully-async --max-staleness 2`` (one training rank, one rollout rank,
torchrun): the sampler's log-probs come from weights up to two steps older than the trainer's
pi_old, so the ratio carries the lag (§7c "Which tokens"). ``--precision bf16`` adds a bf16
sampler against the trainer (``--bf16``: the rollout rank's incremental decode and the
trainer's whole-sequence pass then also differ by bf16 rounding); the default, ``fp32``
(``--no-bf16``), is what a CPU without bf16 matrix units can run (bf16 matmul there is
emulated, 15-50x slower than fp32: docs/reports/rollout-correction-smollm2.md). Four arms:

    none      a rejection that never fires (``--rollout-rs geometric`` with bounds [1e-30,
              1e30]: validation asks every lagged run for a correction; its
              ``train/rollout_rs_rejected_fraction`` shows 0)
    tis       ``--use-tis`` (§7a, clip 2)
    seqmask   ``--rollout-is sequence --rollout-is-mode mask`` in [0.5, 2] (TRL's
              sequence_mask with a lower bound)
    icepop    ``--rollout-rs token`` in [0.5, 5] (IcePop's band)

Part ``length``: partial rollouts (``--partial-rollout --over-sampling-batch-size 2x``,
``--use-tis``, colocated) without a length control and with each of them: the soft overlong
punishment (``--overlong-buffer-len`` a quarter of the limit), the overlong filter
(``--overlong-filter``), the linear length penalty (``--length-penalty-coef 0.5``); the
response length over the steps and the held-out pass@1.

Each run's metrics.jsonl gives the report: per arm and seed the mean mismatch
(``rollout/logprob_abs_diff``, ``rollout/mismatch_k3``), the correction's own metrics, the
held-out pass@1 at the last step, the first and last response length; curves of the response
length and of the mismatch per step (PNG, matplotlib), and ``--json`` the raw numbers (every
run's command, wall time, summary and per-step metrics). ``--model tiny`` runs the built-in
tiny model on its built-in task (a check of the script, seconds per run, no numbers worth
reading).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/rollout_correction_smollm2.py \
        --model models/SmolLM2-135M-Instruct --steps 10 --seeds 1 2 \
        --out runs/rollout-correction --report runs/rollout-correction/report.md \
        --json docs/reports/rollout-correction-smollm2.json
    .venv/bin/python benchmarks/rollout_correction_smollm2.py --model tiny --steps 2 \
        --seeds 1 --out /tmp/rc-check
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

TASK = ("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3"
        "&operators=+&allow_parentheses=false&allow_negation=false")
NEVER = ["--rollout-rs", "geometric", "--rollout-rs-threshold", "1e30",
         "--rollout-rs-threshold-lower", "1e-30"]
CORRECTION_ARMS = {
    "none": NEVER,
    "tis": ["--use-tis"],
    "seqmask": ["--rollout-is", "sequence", "--rollout-is-mode", "mask",
                "--rollout-is-threshold", "2", "--rollout-is-threshold-lower", "0.5"],
    "icepop": ["--rollout-rs", "token", "--rollout-rs-threshold", "5",
               "--rollout-rs-threshold-lower", "0.5"],
}
LENGTH_ARMS = {"partial": [], "partial+soft": None,  # None: the buffer, from the limit (below)
               "partial+filter": ["--overlong-filter"],
               "partial+lenpen": ["--length-penalty-coef", "0.5"]}
PARTS = {"correction": CORRECTION_ARMS, "length": LENGTH_ARMS}
MISMATCH = ("rollout/logprob_abs_diff", "rollout/mismatch_k3")
MISMATCH_ALL = (*MISMATCH, "rollout/logprob_abs_diff_max", "rollout/mismatch_k1",
                "rollout/mismatch_ratio_outside")
CORRECTION_PREFIXES = ("train/rollout_is", "train/rollout_rs", "train/tis_")
LENGTH = "rollout/response_length"


def base_flags(a, seed: int, max_len: int) -> list[str]:
    """What every arm shares: the model, the task and its held-out set, the budget."""
    common = ["--advantage-estimator", "grpo", "--rollout-batch-size", str(a.prompts),
              "--n-samples-per-prompt", str(a.samples), "--num-rollout", str(a.steps),
              "--rollout-max-response-len", str(max_len),
              "--micro-batch-size", str(a.prompts * a.samples),
              "--rollout-temperature", "1.0", "--seed", str(seed), "--log-samples", "0",
              "--eval-interval", str(a.steps), "--device", "cpu"]
    if a.model == "tiny":  # the built-in tiny model and task, with their held-out set
        return [*common, "--lr", "1e-2"]
    return [*common, "--hf-checkpoint", a.model, "--lr", str(a.lr), "--clip-grad", "1.0",
            "--prompt-data", f"{a.task}&size={a.prompts * a.steps}", "--rollout-shuffle",
            "--reasoning-gym-answer", "last_number", "--apply-chat-template",
            "--eval-prompt-data", "heldout", f"{a.task}&size={a.eval_size}",
            "--eval-temperature", "0", "--eval-max-response-len", str(a.eval_max_len)]


def command(part: str, arm: str, seed: int, a, out: Path) -> list[str]:
    """The arm's ``relax train`` command line, with its launcher."""
    if part == "correction":
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc_per_node", "2", "-m", "relax", "train"]
        precision = "--bf16" if a.precision == "bf16" else "--no-bf16"
        flags = [*base_flags(a, seed, a.max_len), precision, "--fully-async",
                 "--max-staleness", "2", *CORRECTION_ARMS[arm]]
    else:
        launcher = [sys.executable, "-m", "relax", "train"]
        soft = ["--overlong-buffer-len", str(max(1, a.partial_max_len // 4))]
        flags = [*base_flags(a, seed, a.partial_max_len), "--no-bf16", "--partial-rollout",
                 "--over-sampling-batch-size", str(2 * a.prompts), "--use-tis",
                 *(soft if LENGTH_ARMS[arm] is None else LENGTH_ARMS[arm])]
    return [*launcher, *flags, "--output-dir", str(out)]


def run(cmd: list[str], out: Path, timeout: float) -> float:
    """Run one arm (its log beside its output directory); the wall seconds."""
    start = time.monotonic()
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with open(f"{out}.log", "w", encoding="utf-8") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout, check=False)
    if proc.returncode != 0:
        sys.exit(f"rollout_correction_smollm2: {out.name} failed (exit {proc.returncode}); "
                 f"see {out}.log")
    return time.monotonic() - start


def read_rows(out: Path) -> list[dict]:
    with open(out / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def summary(rows: list[dict]) -> dict[str, float]:
    """One run's numbers: the mean over steps of the mismatch and correction metrics (the
    maximum of a ``_max``), the last step's held-out pass@1 (or mean reward where the set has
    no pass@k), the first and last response length, the training reward's mean and last."""
    out = {}
    names = sorted({k for r in rows for k in r
                    if k in MISMATCH_ALL or k.startswith(CORRECTION_PREFIXES)
                    or k.startswith("rollout/overlong") or k.startswith("rollout/length_pen")})
    for name in names:
        values = [r[name] for r in rows if name in r and r[name] == r[name]]  # NaN: no token
        if values:
            out[name] = max(values) if name.endswith("_max") else statistics.mean(values)
    last_eval = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if last_eval:
        keys = sorted(k for k in last_eval[-1] if k.endswith("/pass@1")) or \
            sorted(k for k in last_eval[-1] if k.endswith("/mean_reward"))
        if keys:
            out["held-out " + keys[0].split("/")[-1]] = last_eval[-1][keys[0]]
    out["length first"], out["length last"] = rows[0][LENGTH], rows[-1][LENGTH]
    out["reward mean"] = statistics.mean(r["rollout/raw_reward"] for r in rows)
    out["reward last"] = rows[-1]["rollout/raw_reward"]
    return out


def table(results: dict[tuple[str, int], dict[str, float]]) -> list[str]:
    """Markdown rows: one per arm and seed, a column per number any run reported."""
    columns = sorted({k for s in results.values() for k in s})
    lines = ["| arm | seed | " + " | ".join(c.removeprefix("train/").removeprefix("rollout/")
                                            for c in columns) + " |",
             "|---|---:|" + "---:|" * len(columns)]
    for (arm, seed), s in results.items():
        cells = [f"{s[c]:.4g}" if c in s else "" for c in columns]
        lines.append(f"| {arm} | {seed} | " + " | ".join(cells) + " |")
    return lines


def curves(runs: dict[tuple[str, int], list[dict]], names: tuple[str, ...], path: Path) -> None:
    """One panel per metric, a line per arm and seed, over the rollout steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 3.5), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        for (arm, seed), rows in runs.items():
            points = [(r["rollout/step"], r[name]) for r in rows if name in r]
            if points:
                ax.plot(*zip(*points, strict=True), label=f"{arm} s{seed}")
        ax.set_title(name)
        ax.set_xlabel("rollout step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def report(a, parts: dict, commands: dict, walls: dict) -> str:
    """The markdown report of every part that ran, its curves written beside it."""
    image_dir = Path(a.report).parent / "images" if a.report else Path(a.out)
    image_dir.mkdir(parents=True, exist_ok=True)
    lines = [f"# Rollout corrections and length control ({a.model})", "",
             f"{a.steps} rollout steps per run, seeds {' '.join(map(str, a.seeds))}; "
             "reinforce_plus_plus.md §7c, §7d; produced by "
             "benchmarks/rollout_correction_smollm2.py.", ""]
    for part, runs in parts.items():
        names = (LENGTH, *MISMATCH) if part == "correction" else (LENGTH,)
        image = image_dir / f"{Path(a.report).stem}-{part}.png"
        curves(runs, names, image)
        lines += [f"## {part}", "", *table({k: summary(v) for k, v in runs.items()}), "",
                  f"![{part}]({os.path.relpath(image, Path(a.report).parent) if a.report else image})",
                  "", "Commands:", ""]
        # the interpreter as "python": the report names the command, not this machine's paths
        lines += [f"    python {' '.join(commands[part, arm, seed][1:])}  "
                  f"# {walls[part, arm, seed]:.0f} s" for (arm, seed) in runs]
        lines.append("")
    return "\n".join(lines)


def write_json(a, parts: dict, commands: dict, walls: dict) -> None:
    """Every run's command, wall seconds, summary and per-step metrics (times left out)."""
    keep = ("rollout/", "train/", "eval/", "async/staleness")
    runs = {f"{part}/{arm}/seed{seed}": {
        "command": ["python", *commands[part, arm, seed][1:]],
        "wall_s": round(walls[part, arm, seed], 1),
        "summary": summary(rows),
        "steps": [{k: v for k, v in r.items() if k.startswith(keep) and not k.endswith("_time")}
                  for r in rows]}
        for part, arms in parts.items() for (arm, seed), rows in arms.items()}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=False).stdout.strip()
    path = Path(a.json or Path(a.out) / "results.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"commit": commit, "args": vars(a), "runs": runs}, indent=1)
                    + "\n", encoding="utf-8")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="models/SmolLM2-135M-Instruct",
                   help="a Hugging Face model directory, or tiny (the built-in model)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--task", default=TASK, help="the reasoning-gym dataset (without size)")
    p.add_argument("--prompts", type=int, default=2, help="--rollout-batch-size")
    p.add_argument("--samples", type=int, default=4, help="--n-samples-per-prompt")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                   help="the correction part's --no-bf16 / --bf16 (bf16: a GPU, or a CPU with "
                   "bf16 matrix units)")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=sorted(PARTS))
    p.add_argument("--max-len", type=int, default=32, help="correction part's response limit")
    p.add_argument("--partial-max-len", type=int, default=64,
                   help="length part's response limit (a long tail for partial rollouts)")
    p.add_argument("--eval-size", type=int, default=32)
    p.add_argument("--eval-max-len", type=int, default=32)
    p.add_argument("--out", default="runs/rollout-correction")
    p.add_argument("--report", default=None, help="the markdown file (default: OUT/report.md)")
    p.add_argument("--json", default=None, help="the raw numbers (default: OUT/results.json)")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per run")
    p.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    p.add_argument("--resume", action="store_true",
                   help="keep the runs of OUT that finished with the same command")
    p.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: the report and JSON of the runs of OUT that finished")
    a = p.parse_args(argv)
    out = Path(a.out)
    a.report = a.report or str(out / "report.md")
    commands, walls, parts = {}, {}, {}
    for seed in a.seeds:  # every arm of the first seed before the second: a cut run has them
        for part in a.parts:
            for arm in PARTS[part]:
                if not a.arms or arm in a.arms:
                    run_dir = out / f"{part}-{arm}-seed{seed}"
                    commands[part, arm, seed] = command(part, arm, seed, a, run_dir)
    if a.dry_run:
        print("\n".join(" ".join(c) for c in commands.values()))
        return
    out.mkdir(parents=True, exist_ok=True)
    for (part, arm, seed), cmd in commands.items():
        run_dir = out / f"{part}-{arm}-seed{seed}"
        done = run_dir / "wall_s.json"  # a finished run of the same command is kept
        # the same command but for the interpreter's path (another checkout's venv)
        if (a.resume or a.report_only) and done.exists() and \
                json.loads(done.read_text())["command"][1:] == cmd[1:]:
            walls[part, arm, seed] = json.loads(done.read_text())["wall_s"]
        elif a.report_only:  # not run (or not finished): left out of the report
            continue
        else:
            walls[part, arm, seed] = run(cmd, run_dir, a.timeout)
            done.write_text(json.dumps({"command": cmd, "wall_s": walls[part, arm, seed]}))
        parts.setdefault(part, {})[arm, seed] = read_rows(run_dir)
    parts = {part: dict(sorted(runs.items(), key=lambda kv: (list(PARTS[part]).index(kv[0][0]),
                                                            kv[0][1])))
             for part, runs in parts.items()}
    text = report(a, parts, commands, walls)
    write_json(a, parts, commands, walls)
    Path(a.report).parent.mkdir(parents=True, exist_ok=True)
    Path(a.report).write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
