"""Relax vs TRL's ``GRPOTrainer`` on SmolLM2-135M-Instruct, in fp32 and in bf16.

``compare_trl.py`` times the two trainers on tiny random models; this sibling does it on the
real model of docs/reports/reasoning-gym-smollm2.md, at equal precision on both sides, and
reads Relax's phase split and MFU from its ``metrics.jsonl``. Not part of the test suite.
Needs the ``bench`` and ``rl`` extras and the model directory::

    python scripts/fetch_smollm2.py
    .venv/bin/python benchmarks/compare_trl_real.py --threads 1 --summary real.json
    .venv/bin/python benchmarks/compare_trl_real.py --report real.json   # the tables again
    # --precisions fp32 bf16 --k1 1 --k2 2 --repeats 2 --model DIR --workdir DIR

The same work for both:

* the model directory, its tokenizer and chat template (Relax ``--apply-chat-template``; TRL
  gets each prompt as one user message and applies the same template);
* the report's questions: reasoning-gym ``basic_arithmetic``, two terms of 1-3 digits, ``+``,
  seed 0, written to a jsonl and read in order; the report's reward (the last number of the
  reply, scored by reasoning-gym's verifier: 1 for the sum, partial credit when the sum is
  inside a longer number), one Python function both trainers call;
* per step ``--prompts`` x ``--samples`` (4 x 8), at most ``--new-tokens`` (64) new tokens,
  temperature 1, one AdamW step over the whole batch (lr 2e-5 constant, clip 1.0, eps-clip
  0.2, no weight decay); GRPO with group std scaling and a per-response-mean loss, and a k3
  reference KL loss of weight 0.04 (TRL's ratio-weighted KL off, as in ``compare_trl.py``), so
  each step has a reference log-prob pass whose speed is measured too;
* memory knobs at their defaults: TRL checkpoints activations, Relax runs
  ``--micro-batch-size 16`` (the report's; the gradient does not depend on it);
* ``fp32``: both in fp32. ``bf16``: Relax ``--bf16``, TRL ``bf16=True``: on both sides fp32
  weights and AdamW state with the forward passes under bf16 autocast (Relax also stores the
  reference model in bf16); TRL's ``generate`` runs through the autocast its accelerator
  wraps around the model's forward.

Timing is ``compare_trl.py``'s: each trainer in its own process, for ``--k1`` and ``--k2``
steps, per-step time = (wall(K2) - wall(K1)) / (K2 - K1), so imports, model loading and the
start-up measurements cancel; runs alternate Relax, TRL, Relax, TRL; medians over
``--repeats``. Peak RSS is the child's ``ru_maxrss`` (max over the K2 runs). Relax's phase
times and ``perf/*_mfu`` are those of the last step of each K2 run (medians), next to each
trainer's own timer of that step (Relax ``perf/step_time``; TRL's ``step_time``, its
``training_step`` without the optimizer step), which no start-up noise reaches, and to the
share of the counted FLOPs the hardware does (``hardware_share``: ``perf/*_mfu`` count a
group's prompt for each of its rows, Relax's forwards run it once). The reward of every step
of every run is kept; a few steps of a 135M model cannot show a difference of learning, only a
gross one of the reward or the sampling.

``--threads 1`` on a machine with other work: two OpenMP threads stall whenever the scheduler
parks one of them (docs/performance.md), one thread per trainer does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_trl as C  # noqa: E402

TASK = ("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3"
        "&operators=+&allow_parentheses=false&allow_negation=false")
DEFAULT_MODEL = "models/SmolLM2-135M-Instruct"
LR, BETA, MICRO_BATCH = 2e-5, 0.04, 16
PERF_KEYS = ("step_time", "generate_time", "reward_time", "log_prob_time", "advantage_time",
             "update_time", "mfu", "update_mfu", "log_prob_mfu",
             "generate_bandwidth_fraction", "peak_tflops", "generated_tokens_per_s",
             "peak_memory_gb")

_GYM_REWARD = None


def reward(prompts: list[str], responses: list[str], labels: list[str]) -> list[float]:
    """The report's reward for labels that are the sums as text (Relax's reward signature;
    both trainers call it: Relax through ``--custom-rm-path``)."""
    global _GYM_REWARD
    if _GYM_REWARD is None:  # imported on first use: the file is also loaded by Relax
        from relax.rollout.prompts.reasoning_gym_source import make_reward

        _GYM_REWARD = make_reward("last_number")
    items = [{"answer": str(label), "metadata": {"source_dataset": "basic_arithmetic"}}
             for label in labels]
    return _GYM_REWARD(prompts, responses, items)


def write_prompts(workdir: str, count: int) -> str:
    """The first ``count`` questions of the report's training source as a jsonl
    (``input``: the question, ``label``: the sum)."""
    from relax.rollout.prompts.reasoning_gym_source import load_samples, parse_spec

    path = os.path.join(workdir, f"arith-{count}.jsonl")
    if not os.path.isfile(path):
        spec = parse_spec(f"{TASK}&size={count}", "--prompt-data")
        with open(path, "w", encoding="utf-8") as f:
            for s in load_samples(spec, "--prompt-data", answer_format="last_number",
                                  system_prompt=None):
                f.write(json.dumps({"input": s.prompt, "label": s.label["answer"]}) + "\n")
    return path


def relax_command(a, data, steps, out, precision) -> list[str]:
    cmd = [sys.executable, "-m", "relax", "train", "--hf-checkpoint", a.model,
           "--apply-chat-template", "--prompt-data", data,
           "--custom-rm-path", f"{os.path.abspath(__file__)}:reward",
           "--advantage-estimator", "grpo", "--rollout-batch-size", str(a.prompts),
           "--n-samples-per-prompt", str(a.samples),
           "--rollout-max-response-len", str(a.new_tokens), "--rollout-temperature", "1.0",
           "--num-rollout", str(steps), "--lr", str(LR), "--clip-grad", "1.0",
           "--eps-clip", "0.2", "--adam-beta1", "0.9", "--adam-beta2", "0.999",
           "--weight-decay", "0", "--seed", str(a.seed), "--device", "cpu",
           "--micro-batch-size", str(MICRO_BATCH),
           "--use-kl-loss", "--kl-loss-type", "k3", "--kl-loss-coef", str(BETA),
           "--output-dir", out, "--bf16" if precision == "bf16" else "--no-bf16"]
    return cmd


def trl_command(a, data, steps, out, precision) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), "_trl", "--model", a.model,
            "--data", data, "--steps", str(steps), "--out", out, "--seed", str(a.seed),
            "--prompts", str(a.prompts), "--samples", str(a.samples),
            "--new-tokens", str(a.new_tokens), "--precision", precision]


def trl_child(a) -> None:
    """The TRL side, in its own process; writes one line of reward and length per step."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    trainer = C.trl_trainer(a.model, a.data, a.out, steps=a.steps, beta=BETA, lr=LR,
                            seed=a.seed, prompts=a.prompts, samples=a.samples,
                            new_tokens=a.new_tokens, bf16=a.precision == "bf16",
                            reward=reward, chat=True)
    trainer.train()
    with open(os.path.join(a.out, "metrics.jsonl"), "w", encoding="utf-8") as f:
        for h in trainer.state.log_history:
            if "reward" in h:
                f.write(json.dumps({"reward": h["reward"],
                                    "response_length": h.get("completions/mean_length")}) + "\n")


def trl_step_times(log: str) -> list[float]:
    """TRL's own ``step_time`` metric per step (its ``training_step``: generation, scoring,
    reference pass, loss and backward; not the optimizer step), from the child's log."""
    import ast

    times = []
    with open(log, encoding="utf-8") as f:
        for line in f:
            if line.startswith("{") and "'step_time'" in line:
                times.append(float(ast.literal_eval(line.strip())["step_time"]))
    return times


def run(side, a, data, precision, steps, tag, env) -> dict:
    """One child run in a fresh directory: wall seconds, peak RSS and its per-step metrics."""
    out = os.path.join(a.workdir, "runs", f"{side}-{precision}-{steps}-{tag}")
    shutil.rmtree(out, ignore_errors=True)  # Relax writes only into new or its own directories
    os.makedirs(os.path.dirname(out), exist_ok=True)
    command = relax_command if side == "relax" else trl_command
    wall, rss = C.run_child(command(a, data, steps, out, precision), out + ".log", env)
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    steps_out = ([{"reward": r["rollout/raw_reward"],
                   "response_length": r["rollout/response_length"],
                   **{k: r[f"perf/{k}"] for k in PERF_KEYS if f"perf/{k}" in r}} for r in rows]
                 if side == "relax" else rows)
    return {"wall_s": wall, "peak_rss_mib": rss, "steps": steps_out}


def compare(a, data, precision, env) -> dict:
    """The timing rows of one precision: A/B alternating (K1: relax, trl; K2: relax, trl)."""
    per_step = {s: [] for s in ("relax", "trl")}
    runs = {s: [] for s in ("relax", "trl")}
    for rep in range(a.repeats):
        walls = {s: {} for s in per_step}
        for steps in (a.k1, a.k2):
            for side in per_step:
                r = run(side, a, data, precision, steps, f"r{rep}", env)
                walls[side][steps] = r["wall_s"]
                print(f"  {precision} {side} {steps} steps: {r['wall_s']:.1f} s, peak RSS "
                      f"{r['peak_rss_mib']:.0f} MiB, rewards "
                      f"{[round(s['reward'], 3) for s in r['steps']]}", flush=True)
                if steps == a.k2:
                    runs[side].append(r)
        for side in per_step:
            per_step[side].append((walls[side][a.k2] - walls[side][a.k1]) / (a.k2 - a.k1))
        print(f"  {precision} repeat {rep}: relax {per_step['relax'][-1]:.1f} s/step, trl "
              f"{per_step['trl'][-1]:.1f} s/step", flush=True)
    row = {"precision": precision}
    for side in per_step:
        row[side] = {"per_step_s": statistics.median(per_step[side]), "all_s": per_step[side],
                     "peak_rss_mib": max(r["peak_rss_mib"] for r in runs[side]),
                     "rewards": [[s["reward"] for s in r["steps"]] for r in runs[side]],
                     "response_length": statistics.mean(
                         s["response_length"] for r in runs[side] for s in r["steps"])}
    last = [r["steps"][-1] for r in runs["relax"]]
    row["relax"]["perf"] = {k: statistics.median(s[k] for s in last)
                            for k in PERF_KEYS if all(k in s for s in last)}
    row["ratio"] = row["relax"]["per_step_s"] / row["trl"]["per_step_s"]
    complete(row, a, data)
    return row


def hardware_share(a, data, response_length: float) -> float:
    """Hardware FLOPs / counted FLOPs of one forward of the batch: ``perf/*_mfu`` count each
    group's prompt for every one of its ``samples`` rows (docs/performance.md, "Distance to the
    limit"); Relax's training and reference forwards run it once per group. From the
    chat-formatted prompts' token counts and the mean response length."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from relax.rollout.prompts.data import format_prompt
    from relax.trainer.perf.flops import ModelShape

    tokenizer = AutoTokenizer.from_pretrained(a.model)
    with open(data, encoding="utf-8") as f:
        questions = [json.loads(line)["input"] for line in f]
    prompt = [len(tokenizer(format_prompt(tokenizer, q, apply_chat_template=True,
                                          system_prompt=None), add_special_tokens=False)
                  ["input_ids"]) for q in questions]
    with torch.device("meta"):
        shape = ModelShape.of(AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(a.model)))
    r, n = response_length, a.samples
    body, head = 2 * shape.body_weights, 2 * shape.head_weights
    attn = 4 * shape.layers * shape.attn_width
    counted = sum(body * (p + r) + head * r + attn * (p + r) ** 2 for p in prompt)
    # the prompt once per group: its weights and its own attention shared by the n rows
    hardware = sum(body * (p / n + r) + head * r + attn * (p * p / n + (p + r) ** 2 - p * p)
                   for p in prompt)
    return hardware / counted


def internal_step_times(a, side: str, precision: str) -> list[float]:
    """Each trainer's own timer of the last step of each K2 run (Relax ``perf/step_time``,
    TRL ``step_time``), read back from the run directories."""
    times = []
    for rep in range(a.repeats):
        out = os.path.join(a.workdir, "runs", f"{side}-{precision}-{a.k2}-r{rep}")
        if side == "trl":
            times += trl_step_times(out + ".log")[-1:]
        else:
            with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
                times.append(json.loads(f.readlines()[-1])["perf/step_time"])
    return times


def complete(row: dict, a, data: str) -> None:
    """Add the figures derived after the runs: the hardware share and the own timers."""
    row["hardware_share"] = hardware_share(a, data, row["relax"]["response_length"])
    for side in ("relax", "trl"):
        row[side]["internal_step_s"] = internal_step_times(a, side, row["precision"])


def markdown(rows) -> str:
    out = ["| precision | Relax s/step | TRL s/step | Relax/TRL | repeats (Relax / TRL) | "
           "Relax peak RSS MiB | TRL peak RSS MiB | mean response tokens (Relax / TRL) |",
           "|---|---:|---:|---:|---|---:|---:|---|"]
    for r in rows:
        x, t = r["relax"], r["trl"]
        reps = ", ".join(f"{u:.1f}/{v:.1f}" for u, v in zip(x["all_s"], t["all_s"], strict=True))
        out.append(f"| {r['precision']} | {x['per_step_s']:.1f} | {t['per_step_s']:.1f} | "
                   f"{r['ratio']:.2f} | {reps} | {x['peak_rss_mib']:.0f} | "
                   f"{t['peak_rss_mib']:.0f} | {x['response_length']:.1f} / "
                   f"{t['response_length']:.1f} |")
    out += ["", "| precision | Relax " + " | ".join(PERF_KEYS) + " |",
            "|---|" + "---:|" * len(PERF_KEYS)]
    for r in rows:
        perf = r["relax"]["perf"]
        out.append(f"| {r['precision']} | " + " | ".join(
            f"{perf[k]:.3g}" if k in perf else "-" for k in PERF_KEYS) + " |")
    out.append("")
    for r in rows:
        share = r.get("hardware_share")
        if share:
            out.append(f"{r['precision']}: hardware FLOPs / counted FLOPs {share:.3f} (the prompt "
                       "once per group); update and log-prob MFU of the hardware: "
                       f"{r['relax']['perf'].get('update_mfu', 0) * share:.3f} and "
                       f"{r['relax']['perf'].get('log_prob_mfu', 0) * share:.3f}")
        for side in ("relax", "trl"):
            internal = r[side].get("internal_step_s")
            if internal:
                out.append(f"{r['precision']} {side}: own per-step timer, last step of each K2 "
                           f"run: {' '.join(f'{v:.1f}' for v in internal)} s")
    out.append("")
    for r in rows:
        for side in ("relax", "trl"):
            out.append(f"{r['precision']} {side} rewards per K2 run: "
                       + "; ".join(" ".join(f"{v:.3f}" for v in run)
                                   for run in r[side]["rewards"]))
    return "\n".join(out)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_trl"]:
        p = argparse.ArgumentParser()
        for name in ("--model", "--data", "--out"):
            p.add_argument(name, required=True)
        for name in ("--steps", "--seed", "--prompts", "--samples", "--new-tokens"):
            p.add_argument(name, type=int, required=True)
        p.add_argument("--precision", choices=("fp32", "bf16"), required=True)
        return trl_child(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--workdir", default="/tmp/relax-vs-trl-real")
    p.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                   choices=["fp32", "bf16"])
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--k1", type=int, default=1)
    p.add_argument("--k2", type=int, default=2,
                   help="a step here takes tens of seconds, so one step of difference "
                        "already dwarfs the start-up noise (~1 s)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=None,
                   help="OMP_NUM_THREADS for both (default: each trainer's own choice)")
    p.add_argument("--summary", default=None, help="write the results as JSON here")
    p.add_argument("--report", default=None, metavar="SUMMARY",
                   help="print the tables of a saved --summary (nothing is run)")
    a = p.parse_args(argv)
    if a.report:
        with open(a.report, encoding="utf-8") as f:
            saved = json.load(f)
        a = argparse.Namespace(**saved["args"])
        for row in saved["timing"]:
            if "hardware_share" not in row:
                complete(row, a, write_prompts(a.workdir, a.k2 * a.prompts))
        print(markdown(saved["timing"]))
        return None
    if a.k2 <= a.k1:
        p.error("--k2 must be larger than --k1")
    if (a.prompts * a.samples) % MICRO_BATCH:
        p.error(f"--prompts x --samples must be a multiple of {MICRO_BATCH} (Relax's "
                "--micro-batch-size here)")
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        p.error(f"--model {a.model}: no config.json (python scripts/fetch_smollm2.py)")
    a.model = os.path.abspath(a.model)
    os.makedirs(a.workdir, exist_ok=True)
    env = C.child_env(a.threads)
    data = write_prompts(a.workdir, a.k2 * a.prompts)
    rows = []
    for precision in a.precisions:
        rows.append(compare(a, data, precision, env))
        if a.summary:  # after each precision: a long run that is stopped keeps what it has
            with open(a.summary, "w", encoding="utf-8") as f:
                json.dump({"timing": rows, "args": vars(a)}, f, indent=1)
    print(markdown(rows))


if __name__ == "__main__":
    main()
