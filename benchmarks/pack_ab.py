"""Packed, prefix-shared passes: Relax before (A, a checkout of an earlier commit) against
after (B, this tree) on the TRL-comparison configuration of ``compare_trl_real.py``
(SmolLM2-135M-Instruct, chat template, GRPO with a k3 KL loss of 0.04, one AdamW step per
rollout), in fp32 and bf16. Not part of the test suite::

    git worktree add /tmp/relax-before <commit>
    .venv/bin/python benchmarks/pack_ab.py --before /tmp/relax-before --summary ab.json
    # --prompts 8 --samples 4 --new-tokens 64 --steps 2 --repeats 2 --threads 1

Each run is its own process (``python -m relax train`` started IN its tree: ``-m`` puts the
working directory before ``PYTHONPATH`` on the path) for ``--steps`` rollout steps; runs alternate A, B, A, B within each precision, and the figures are medians
over ``--repeats`` of the LAST step's own timers (``perf/*_time``: no start-up inside), its
peak memory (``perf/peak_memory_gb``) and the process's peak RSS and CPU seconds (user +
system, the whole run: start-up and every step; with one thread a busy machine stretches the
wall time, much less the CPU time). Both arms sample the same
responses at step 1 (same seed, generation unchanged); a later step follows float rounding of
the update. The load average (1 min) is recorded before and after each run.

The matrix-product limit of a step: its model FLOPs with each group's prompt counted once
(B's ``perf/mfu`` counts them so, relax/trainer/perf/flops.py) over the peak FLOP/s, the same
figure for both arms (``RELAX_PEAK_TFLOPS`` is measured once here, best of 5 1024^3 matmuls on
``--threads`` threads, and given to every run, so both divide by the same peak):
``limit_s = perf/mfu(B) x perf/step_time(B)``; each arm's fraction = ``limit_s / step_time``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_trl_real as R  # noqa: E402

PHASES = ("step_time", "generate_time", "log_prob_time", "update_time", "mfu", "update_mfu",
          "log_prob_mfu", "peak_memory_gb", "update_padding_fraction", "peak_tflops")


def peak_tflops(threads: int, bf16: bool) -> float:
    """TFLOP/s of square matmuls in the run's compute dtype, best of 3 measurements."""
    import torch

    torch.set_num_threads(threads)
    from relax.trainer.perf.flops import measure_peak_flops

    os.environ.pop("RELAX_PEAK_TFLOPS", None)
    return max(measure_peak_flops(torch.device("cpu"), bf16) for _ in range(3)) / 1e12


def run_child(cmd: list[str], log: str, env, cwd: str) -> tuple[float, float, float]:
    """(wall s, peak RSS MiB, CPU s) of the child run in ``cwd``."""
    import subprocess
    import time

    with open(log, "w", encoding="utf-8") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        with open(log, encoding="utf-8") as f:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{f.read()[-3000:]}")
    return wall, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def one_run(a, tree: str, arm: str, precision: str, rep: int, data: str, env: dict) -> dict:
    out = os.path.abspath(os.path.join(a.workdir, "runs", f"{arm}-{precision}-r{rep}"))
    if os.path.isdir(out):
        import shutil

        shutil.rmtree(out)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = R.relax_command(a, data, a.steps, out, precision)
    child = dict(env, PYTHONPATH=tree)
    load_before = os.getloadavg()[0]
    wall, rss, cpu = run_child(cmd, out + ".log", child, cwd=tree)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    last = rows[-1]
    result = {"arm": arm, "precision": precision, "rep": rep, "wall_s": wall, "cpu_s": cpu,
              "tree": tree, "pass_layout": "pass_layout" in open(
                  os.path.join(out, "config.json"), encoding="utf-8").read(),
              "peak_rss_mib": rss, "load_before": load_before, "load_after": os.getloadavg()[0],
              "rewards": [r["rollout/raw_reward"] for r in rows],
              "response_length": [r["rollout/response_length"] for r in rows],
              **{k: last[f"perf/{k}"] for k in PHASES if f"perf/{k}" in last}}
    print(json.dumps(result), flush=True)
    return result


def summarize(results: list[dict]) -> dict:
    out = {}
    for precision in sorted({r["precision"] for r in results}):
        rows = {arm: [r for r in results if r["precision"] == precision and r["arm"] == arm]
                for arm in ("A", "B")}
        med = {arm: {k: statistics.median(r[k] for r in rs)
                     for k in (*PHASES, "peak_rss_mib", "cpu_s", "wall_s")
                     if rs and all(k in r for r in rs)} for arm, rs in rows.items()}
        limit = med["B"]["mfu"] * med["B"]["step_time"]
        for arm in med:
            med[arm]["matmul_limit_fraction"] = limit / med[arm]["step_time"]
            med[arm]["load"] = [round(r["load_before"], 2) for r in rows[arm]]
        out[precision] = {"A": med["A"], "B": med["B"], "limit_s": limit,
                          "B_over_A": med["B"]["step_time"] / med["A"]["step_time"]}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--before", required=True, help="a checkout of the earlier commit (A)")
    p.add_argument("--after", default=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))), help="this tree (B)")
    p.add_argument("--model", default=R.DEFAULT_MODEL)  # give it absolute: runs start in trees
    p.add_argument("--workdir", default="runs/pack-ab")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--summary", default=None)
    a = p.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    data = R.write_prompts(os.path.abspath(a.workdir), a.prompts * a.steps)
    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{os.cpu_count()} CPUs", flush=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    env["RELAX_MEMORY_BANDWIDTH_GBPS"] = "10"  # not compared here; skips the measurement
    peaks, results = {}, []
    for precision in a.precisions:
        peaks[precision] = peak_tflops(a.threads, precision == "bf16")
        env["RELAX_PEAK_TFLOPS"] = f"{peaks[precision]:.6f}"
        print(f"{precision} peak {peaks[precision]:.4f} TFLOP/s on {a.threads} thread(s), load "
              f"{os.getloadavg()[0]:.2f}", flush=True)
        for rep in range(a.repeats):
            for arm, tree in (("A", a.before), ("B", a.after)):
                results.append(one_run(a, os.path.abspath(tree), arm, precision, rep, data, env))
    summary = {"peak_tflops": peaks, "runs": results,
               "medians": summarize(results)}
    print(json.dumps(summary["medians"], indent=1))
    if a.summary:
        with open(a.summary, "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
