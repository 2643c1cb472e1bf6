"""Relax vs TRL's ``GRPOTrainer``: the same GRPO step, timed side by side on the CPU.

Not part of the test suite. Needs the ``bench`` extra (``pip install -e ".[bench]"
torch==2.13.0``). Writes its models, data and runs under ``--workdir``::

    .venv/bin/python benchmarks/compare_trl.py                   # timing + 20-step rewards
    .venv/bin/python benchmarks/compare_trl.py --skip-reward     # timing only

The same work for both:

* the same tiny Qwen3 saved to a local directory by ``relax.tiny_model`` (sizes
  ``h64``: hidden 64 / 2 layers, ``h256``: hidden 256 / 4 layers), the same character
  tokenizer, the same prompts (a jsonl of ``copy``-task prompts, read in order) and the same
  reward (``relax.rollout.prompts.tasks.CopyTask.reward``);
* per step 8 prompts x 8 samples, at most 32 new tokens, temperature 1, one AdamW step over all
  64 samples, lr constant, clip-grad 1.0, eps-clip 0.2 (TRL: one pass with activation
  checkpointing, its default; Relax: ``--micro-batch-size`` samples per pass, 64 at h64 and 32
  at h256 by default -- the same gradient
  (reinforce_plus_plus.md §7), with half of the activations alive);
* GRPO with group std scaling and a per-response-mean loss: Relax ``--advantage-estimator grpo``
  (response mean is its default), TRL ``loss_type="grpo"``, ``scale_rewards="group"``;
* setting ``nokl``: no reference; setting ``kl``: a k3 reference KL loss of weight ``--beta``
  (Relax ``--use-kl-loss --kl-loss-type k3 --kl-loss-coef BETA``, TRL ``beta=BETA``, whose
  per-token KL is the k3 estimator; TRL's ratio-weighted KL, on by default in trl 1.16, is
  turned off: it changes the KL gradient to that of k2, see ``trl_lockstep.py``).

Timing: each trainer runs as its own process, from the outside, for ``--k1`` and for ``--k2``
steps; per-step time = (wall(K2) - wall(K1)) / (K2 - K1), so imports, model loading and
start-up cancel. Runs alternate Relax, TRL, Relax, TRL, ... (load from other processes hits
both alike); the table gives medians over ``--repeats`` (K1, K2) pairs. Generated tokens/s =
mean response length x 64 / per-step time (the response lengths of the K2 runs). Peak RSS is
the child's ``ru_maxrss`` from ``os.wait4`` (max over the K2 runs). Final reward: the mean of
the last 5 of ``--reward-steps`` steps, per seed; the table gives the mean and median over
seeds, in how many seeds Relax ends higher, and a permutation test of the two means (these
runs use ``OMP_NUM_THREADS=1``; ``--jobs 2`` runs two of them at a time, which changes no
number).

Threads: each trainer keeps its own default (Relax: one intra-op thread per local rank's share
of the cores for a ``--hf-checkpoint`` model; TRL: torch's default); ``--threads N`` forces
``OMP_NUM_THREADS=N`` for both (Relax still sets its own count inside).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

SIZES = {
    "h64": dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "h256": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=64),
}
PROMPTS, SAMPLES, NEW_TOKENS = 8, 8, 32
DEFAULT_K2 = {"h64": 22, "h256": 10}  # long-run steps: the difference must dwarf start-up noise
DEFAULT_MICRO_BATCH = {"h64": 64, "h256": 32}  # Relax's; TRL checkpoints activations instead
MODEL_SEED = 7
LAST = 5  # final reward = mean of the last LAST steps


# ---------------------------------------------------------------------------- preparation
def per_size(values, defaults, sizes, flag) -> dict:
    """{size: value}: the per-size defaults, one value for all sizes, or one per size."""
    if values is None:
        return {s: defaults[s] for s in sizes}
    if len(values) not in (1, len(sizes)):
        raise ValueError(f"{flag}: give one value, or one per --sizes entry ({len(sizes)})")
    return dict(zip(sizes, values * len(sizes) if len(values) == 1 else values, strict=True))


def prompt_steps(a) -> int:
    """Steps the prompt file must cover: the longest timing run and the reward runs."""
    return max(*a.k2.values(), a.reward_steps)


def prepare(workdir: str, size: str, max_steps: int) -> tuple[str, str]:
    """Save the tiny model + tokenizer of ``size`` and ``max_steps`` x 8 copy prompts."""
    from relax.rollout.prompts.tasks import CopyTask
    from relax.tiny_model import build_tiny_model, build_tokenizer

    model_dir = os.path.join(workdir, f"model-{size}")
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        tok = build_tokenizer()
        build_tiny_model(tok, seed=MODEL_SEED, **SIZES[size]).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
    data = os.path.join(workdir, f"prompts-{max_steps * PROMPTS}.jsonl")
    if not os.path.isfile(data):
        rng, task = random.Random(0), CopyTask()
        with open(data, "w", encoding="utf-8") as f:
            for _ in range(max_steps * PROMPTS):
                prompt, label = task.sample(rng)
                f.write(json.dumps({"input": prompt, "label": label}) + "\n")
    return model_dir, data


# ---------------------------------------------------------------------------- the two runs
def relax_command(model_dir, data, steps, out, *, beta, lr, seed, micro_batch_size=None
                  ) -> list[str]:
    cmd = [sys.executable, "-m", "relax", "train", "--hf-checkpoint", model_dir,
           "--prompt-data", data, "--rm-type", "copy", "--advantage-estimator", "grpo",
           "--rollout-batch-size", str(PROMPTS), "--n-samples-per-prompt", str(SAMPLES),
           "--rollout-max-response-len", str(NEW_TOKENS), "--rollout-temperature", "1.0",
           "--num-rollout", str(steps), "--lr", str(lr), "--clip-grad", "1.0",
           "--eps-clip", "0.2", "--adam-beta1", "0.9", "--adam-beta2", "0.999",
           "--weight-decay", "0", "--seed", str(seed), "--device", "cpu", "--output-dir", out]
    if micro_batch_size:
        cmd += ["--micro-batch-size", str(micro_batch_size)]
    if beta:
        cmd += ["--use-kl-loss", "--kl-loss-type", "k3", "--kl-loss-coef", str(beta)]
    return cmd


def trl_command(model_dir, data, steps, out, *, beta, lr, seed, micro_batch_size=None
                ) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "_trl", "--model", model_dir,
            "--data", data, "--steps", str(steps), "--out", out, "--beta", str(beta),
            "--lr", str(lr), "--seed", str(seed)]


def trl_trainer(model_dir, data, out, *, steps, beta, lr, seed, on_rewards=None,
                bias_corrected_kl=False, callbacks=(), prompts=PROMPTS, samples=SAMPLES,
                new_tokens=NEW_TOKENS, bf16=False, reward=None, chat=False):
    """TRL's ``GRPOTrainer`` set up for the comparison's work: the one place its settings live.

    The defaults are this script's tiny setup; ``compare_trl_real.py`` passes its own batch
    (``prompts`` x ``samples``, ``new_tokens``), ``reward`` (``f(prompts, responses, labels)``,
    Relax's signature; default the copy task's), ``chat`` (each prompt as one user message, so
    TRL applies the tokenizer's chat template as Relax's ``--apply-chat-template`` does) and
    ``bf16`` (TRL's mixed precision: fp32 weights, bf16 autocast). ``on_rewards(list)`` sees
    each batch's rewards; ``bias_corrected_kl`` is trl 1.16's
    default, which multiplies its k3 KL by the (differentiable) importance ratio and so turns
    the KL gradient into ``logp - logp_ref``, the k2 gradient, while the loss value stays k3.
    Relax's ``--kl-loss-type k3`` is §2's k3 with its exact gradient, so the comparison
    turns it off (then TRL's KL-only gradient equals Relax's on one batch, cosine 1.000).
    """
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from relax.rollout.prompts.tasks import CopyTask

    with open(data, encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    score = reward or CopyTask().reward

    def batch_reward(prompts, completions, label, **_):
        if chat:  # conversational rows: TRL passes message lists, Relax's rewards take text
            prompts = [p[-1]["content"] for p in prompts]
            completions = [c[-1]["content"] for c in completions]
        rewards = score(prompts, completions, label)
        if on_rewards is not None:
            on_rewards(rewards)
        return rewards

    args = GRPOConfig(
        output_dir=out, use_cpu=True, bf16=bf16, seed=seed, report_to="none",
        save_strategy="no", logging_steps=1, disable_tqdm=True, max_steps=steps,
        per_device_train_batch_size=prompts * samples, gradient_accumulation_steps=1,
        steps_per_generation=1, num_iterations=1, num_generations=samples,
        max_completion_length=new_tokens, temperature=1.0, top_p=1.0, top_k=0,
        loss_type="grpo", scale_rewards="group", beta=beta, epsilon=0.2,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
        max_grad_norm=1.0, adam_beta1=0.9, adam_beta2=0.999, weight_decay=0.0,
        shuffle_dataset=False, dataloader_num_workers=0, log_completions=False,
        use_bias_correction_kl=bias_corrected_kl,
    )
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        reward_funcs=batch_reward, args=args, processing_class=AutoTokenizer.from_pretrained(
            model_dir), callbacks=list(callbacks),
        train_dataset=Dataset.from_list([
            {"prompt": [{"role": "user", "content": r["input"]}] if chat else r["input"],
             "label": r["label"]} for r in rows]))


def trl_child(a) -> None:
    """The TRL side, in its own process: GRPOTrainer on the same model, data and reward."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    trainer = trl_trainer(a.model, a.data, a.out, steps=a.steps, beta=a.beta, lr=a.lr,
                          seed=a.seed)
    trainer.train()
    steps = [h for h in trainer.state.log_history if "reward" in h]
    with open(os.path.join(a.out, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for h in steps:
            f.write(json.dumps({"reward": h["reward"],
                                "response_length": h.get("completions/mean_length")}) + "\n")


def relax_metrics(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [{"reward": r["rollout/raw_reward"], "response_length": r["rollout/response_length"]}
            for r in rows]


def trl_metrics(out) -> list[dict]:
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def run_child(cmd: list[str], log: str, env) -> tuple[float, float]:
    """Run to completion; return (wall seconds, peak RSS in MiB of the child)."""
    with open(log, "w", encoding="utf-8") as f:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        with open(log, encoding="utf-8") as f:
            tail = f.read()[-3000:]
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")
    return wall, usage.ru_maxrss / 1024


SIDES = {"relax": (relax_command, relax_metrics), "trl": (trl_command, trl_metrics)}


def run_side(side, workdir, size, setting, steps, tag, a, env, seed):
    model_dir, data = prepare(workdir, size, prompt_steps(a))
    out = os.path.join(workdir, "runs", f"{side}-{size}-{setting}-{steps}-{tag}")
    # a fresh directory: Relax appends to an existing metrics.jsonl (resume semantics), and a
    # previous invocation's rows would enter the response lengths and rewards read back
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command, metrics = SIDES[side]
    beta = a.beta if setting == "kl" else 0.0
    cmd = command(model_dir, data, steps, out, beta=beta, lr=a.lr, seed=seed,
                  micro_batch_size=a.micro_batch_size[size])
    # the log beside the run directory: Relax refuses an output directory holding files it
    # did not write
    wall, rss = run_child(cmd, out + ".log", env)
    return wall, rss, metrics(out)


# ---------------------------------------------------------------------------- the table
def timing(a, env) -> list[dict]:
    rows = []
    for size in a.sizes:
        for setting in a.settings:
            per_step = {s: [] for s in SIDES}
            rss = {s: [] for s in SIDES}
            length = {s: [] for s in SIDES}
            k2 = a.k2[size]
            for rep in range(a.repeats):
                walls = {s: {} for s in SIDES}
                for steps in (a.k1, k2):  # A, B, A, B
                    for side in SIDES:
                        wall, peak, m = run_side(side, a.workdir, size, setting, steps,
                                                 f"r{rep}", a, env, a.seed)
                        walls[side][steps] = wall
                        if steps == k2:
                            rss[side].append(peak)
                            length[side].extend(r["response_length"] for r in m)
                for side in SIDES:
                    per_step[side].append((walls[side][k2] - walls[side][a.k1]) / (k2 - a.k1))
                print(f"  {size} {setting} repeat {rep}: " + ", ".join(
                    f"{s} {per_step[s][-1]:.3f} s/step" for s in SIDES), flush=True)
            row = {"size": size, "setting": setting}
            for side in SIDES:
                t = statistics.median(per_step[side])
                row[side] = {"per_step_s": t, "all_s": per_step[side],
                             "tokens_per_s": statistics.mean(length[side]) * PROMPTS * SAMPLES / t,
                             "peak_rss_mib": max(rss[side])}
            row["ratio"] = row["relax"]["per_step_s"] / row["trl"]["per_step_s"]
            row["ratios"] = [r / t for r, t in zip(per_step["relax"], per_step["trl"],
                                                   strict=True)]
            rows.append(row)
    return rows


def permutation_p(x: list[float], y: list[float], rounds: int = 20000) -> float:
    """Two-sided permutation test of mean(x) == mean(y): the share of random relabellings
    whose mean difference is at least the observed one."""
    rng, pooled = random.Random(0), x + y
    observed = abs(statistics.mean(x) - statistics.mean(y))
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        hits += abs(statistics.mean(pooled[:len(x)]) - statistics.mean(pooled[len(x):])) >= observed
    return hits / rounds


def rewards(a, env) -> list[dict]:
    # one thread per run: the reward curve does not depend on speed, and --jobs 2 then keeps
    # both cores busy
    env = {**env, "OMP_NUM_THREADS": "1"}
    out = []
    for size in a.sizes:
        for setting in a.settings:
            prepare(a.workdir, size, prompt_steps(a))  # once, before the threads

            def one(job, size=size, setting=setting):
                side, seed = job
                return run_side(side, a.workdir, size, setting, a.reward_steps,
                                f"reward-s{seed}", a, env, seed)

            jobs = [(side, seed) for seed in a.reward_seeds for side in SIDES]
            with ThreadPoolExecutor(a.jobs) as pool:
                runs = pool.map(one, jobs)
                finals = {side: [] for side in SIDES}
                for (side, _), (_, _, m) in zip(jobs, runs, strict=True):
                    finals[side].append(statistics.mean(r["reward"] for r in m[-LAST:]))
            row = {"size": size, "setting": setting, "seeds": list(a.reward_seeds)}
            for side in SIDES:
                row[side] = {"final_reward": statistics.mean(finals[side]),
                             "median": statistics.median(finals[side]),
                             "per_seed": finals[side]}
            row["relax_ahead"] = sum(x > y for x, y in zip(finals["relax"], finals["trl"],
                                                           strict=True))
            row["p_value"] = (permutation_p(finals["relax"], finals["trl"])
                              if len(a.reward_seeds) > 1 else None)
            print(f"  {size} {setting}: " + ", ".join(
                f"{s} {row[s]['final_reward']:.4f} {[round(v, 4) for v in row[s]['per_seed']]}"
                for s in SIDES), flush=True)
            out.append(row)
    return out


def markdown(rows, reward_rows) -> str:
    lines = ["| size | setting | relax s/step | TRL s/step | relax/TRL | relax tok/s | TRL tok/s "
             "| relax peak RSS MiB | TRL peak RSS MiB |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"] if rows else []
    for r in rows:
        x, t = r["relax"], r["trl"]
        lines.append(f"| {r['size']} | {r['setting']} | {x['per_step_s']:.3f} | "
                     f"{t['per_step_s']:.3f} | {r['ratio']:.2f} | {x['tokens_per_s']:.0f} | "
                     f"{t['tokens_per_s']:.0f} | {x['peak_rss_mib']:.0f} | "
                     f"{t['peak_rss_mib']:.0f} |")
    if reward_rows:
        lines += ["", "| size | setting | seeds | Relax mean / median | TRL mean / median | "
                  "Relax ahead | permutation p |", "|---|---|---:|---:|---:|---:|---:|"]
        for r in reward_rows:
            x, t, p = r["relax"], r["trl"], r["p_value"]
            lines.append(f"| {r['size']} | {r['setting']} | {len(r['seeds'])} | "
                         f"{x['final_reward']:.4f} / {x['median']:.4f} | "
                         f"{t['final_reward']:.4f} / {t['median']:.4f} | "
                         f"{r['relax_ahead']} of {len(r['seeds'])} | "
                         f"{'-' if p is None else f'{p:.2f}'} |")
        for r in reward_rows:
            lines.append(f"\n{r['size']} {r['setting']} per seed {r['seeds']}:\n"
                         + "\n".join(f"  {side}: " + " ".join(f"{v:.4f}" for v in r[side]["per_seed"])
                                     for side in SIDES))
    return "\n".join(lines)


def child_env(threads: int | None) -> dict:
    """The trainers' environment (``OMP_NUM_THREADS`` when ``--threads`` is given), after one
    line naming the machine and the library versions."""
    import torch
    import transformers
    import trl

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"torch {torch.__version__}, transformers {transformers.__version__}, trl "
          f"{trl.__version__}, Python {platform.python_version()}", flush=True)
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def main(argv=None) -> None:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["_trl"]:
        p = argparse.ArgumentParser()
        for name in ("--model", "--data", "--out"):
            p.add_argument(name, required=True)
        p.add_argument("--steps", type=int, required=True)
        p.add_argument("--beta", type=float, default=0.0)
        p.add_argument("--lr", type=float, required=True)
        p.add_argument("--seed", type=int, default=0)
        return trl_child(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", default="/tmp/relax-vs-trl")
    p.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    p.add_argument("--settings", nargs="+", default=["nokl", "kl"], choices=["nokl", "kl"])
    p.add_argument("--k1", type=int, default=2)
    p.add_argument("--k2", type=int, nargs="+", default=None,
                   help="long-run steps, one per --sizes entry (or one for all); default 22 at "
                        "h64, 10 at h256: the difference must dwarf the start-up noise (~1 s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--reward-steps", type=int, default=20)
    p.add_argument("--reward-seeds", type=int, nargs="+", default=list(range(101, 117)),
                   help="seeds of the reward runs (16 by default: single runs differ widely)")
    p.add_argument("--jobs", type=int, default=2,
                   help="reward runs at a time (each at one thread)")
    p.add_argument("--skip-reward", action="store_true")
    p.add_argument("--skip-timing", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--micro-batch-size", type=int, nargs="+", default=None,
                   help="Relax's --micro-batch-size, one per --sizes entry (or one for all); "
                        "default 64 at h64, 32 at h256: its memory knob, the counterpart of "
                        "TRL's default activation checkpointing (the gradient does not depend "
                        "on it, §7)")
    p.add_argument("--summary", default=None, help="write the results as JSON here")
    a = p.parse_args(argv)
    try:
        a.k2 = per_size(a.k2, DEFAULT_K2, a.sizes, "--k2")
        a.micro_batch_size = per_size(a.micro_batch_size, DEFAULT_MICRO_BATCH, a.sizes,
                                      "--micro-batch-size")
    except ValueError as e:
        p.error(str(e))
    if min(a.k2.values()) <= a.k1:
        p.error("--k2: each value must be larger than --k1")
    if any(m < 1 or (PROMPTS * SAMPLES) % m for m in a.micro_batch_size.values()):
        p.error(f"--micro-batch-size: each value must divide {PROMPTS * SAMPLES}")
    os.makedirs(a.workdir, exist_ok=True)
    env = child_env(a.threads)
    rows = [] if a.skip_timing else timing(a, env)
    if rows and a.summary:
        with open(a.summary, "w", encoding="utf-8") as f:
            json.dump({"timing": rows, "args": vars(a)}, f, indent=1)
    reward_rows = [] if a.skip_reward else rewards(a, env)
    print(markdown(rows, reward_rows))
    if a.summary:
        with open(a.summary, "w", encoding="utf-8") as f:
            json.dump({"timing": rows, "reward": reward_rows, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
