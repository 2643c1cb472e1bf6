"""What routing replay (docs/algorithms/moe.md §M5) does to a mixture-of-experts policy's
sampler/trainer mismatch, and what a MoE step costs against a dense model of the same active
size (docs/reports/moe-replay.md holds the measurement). Not part of the test suite::

    OMP_NUM_THREADS=1 PYTHONPATH=. .venv/bin/python benchmarks/moe_replay.py \\
        --parts runs bf16 cost --steps 24 --cost-repeats 15 --out docs/reports/moe-replay.json

The model: the tiny Qwen3-MoE of relax/tiny_model.py (4 experts, top-2) from a random
initialization (``--seed``), built in code; the reward: :func:`odd_share`.

``runs``: ``relax train`` with a bf16 sampler against the fp32 trainer (``--rollout-bf16``
on the CPU, where ``--bf16`` is off) for ``--steps`` steps, two optimizer steps per rollout
step (so the policy moves between the sampler and the second update), the same seed, in
three arms: no replay, R2 (``--use-routing-replay``), R3 (``--use-rollout-routing-replay``).
Each step's reward, the share of (token, MoE layer) pairs of the update whose experts differ
from the sampler's (``train/moe_replayed_routing_mismatch``; ``train/moe_routing_mismatch``:
the router's own choice against the sampler's), and the log-prob mismatch between the
sampler and the trainer's pi_old (``rollout/logprob_abs_diff`` mean and max, k3).

``bf16``: what the bf16 sampler is on this CPU: the share of a bf16-autocast linear layer's
outputs that are the correctly rounded bf16 value of the float64 product of its bf16-rounded
inputs, and the sampler's decode of one batch under bf16 autocast against fp32 (alternated,
medians in seconds).

``cost``: one update step (a packed forward and backward of one sampled batch and an AdamW
step) of the MoE against a dense Qwen3 whose MLP width is the active experts'
(``k * moe_intermediate_size``), everything else the same; alternated MoE, dense, MoE, ...
``--cost-repeats`` times each, medians in seconds.
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

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROMPTS = ("12+3=", "ab=", "x=", "7*7=", "hello ", "1,2,3,", "abc", "Q:", "9-4=", "zz")
KEEP = ("rollout/raw_reward", "train/moe_replayed_routing_mismatch",
        "train/moe_routing_mismatch", "rollout/logprob_abs_diff",
        "rollout/logprob_abs_diff_max", "rollout/mismatch_k3", "perf/step_time")
ARMS = {"none": (), "r2": ("--use-routing-replay",), "r3": ("--use-rollout-routing-replay",)}


def odd_share(prompts, responses, labels):
    """The reward: the share of the response's characters whose code is odd (0 when empty);
    a rule any policy can climb by choosing characters, no task knowledge needed."""
    return [sum(ord(c) % 2 for c in r) / max(1, len(r)) for r in responses]


def _moe(seed: int):
    from relax.tiny_model import build_tiny_moe, build_tokenizer

    tok = build_tokenizer()
    return tok, build_tiny_moe(tok, seed=seed)


def _dense(tok, moe, seed: int):
    """A dense tiny Qwen3 of the MoE's active size: MLP width k * moe_intermediate_size."""
    from relax.tiny_model import build_tiny_model

    c = moe.config
    return build_tiny_model(tok, seed=seed,
                            intermediate_size=c.num_experts_per_tok * c.moe_intermediate_size)


def run(model_dir: str, data: str, arm: str, args, tmp: str) -> tuple[list[dict], float]:
    """One arm's ``relax train``: its metrics rows and its wall time in seconds."""
    out = os.path.join(tmp, "run_" + arm)
    cmd = [sys.executable, "-m", "relax", "train", "--hf-checkpoint", model_dir,
           "--prompt-data", data, "--custom-rm-path",
           os.path.join(REPO, "benchmarks", "moe_replay.py") + ":odd_share",
           "--num-rollout", str(args.steps), "--rollout-batch-size", "4",
           "--n-samples-per-prompt", "4", "--num-steps-per-rollout", "2",
           "--rollout-max-response-len", str(args.new_tokens), "--advantage-estimator", "grpo",
           "--lr", "1e-3", "--rollout-bf16", "--get-mismatch-metrics", "--seed", str(args.seed),
           "--device", "cpu", "--output-dir", out, *ARMS[arm]]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO})
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"{arm}: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [{"step": r["rollout/step"], **{k: r.get(k) for k in KEEP}} for r in rows], wall


def runs(args, tmp: str) -> dict:
    tok, moe = _moe(args.seed)
    model_dir, data = os.path.join(tmp, "tiny_moe"), os.path.join(tmp, "prompts.jsonl")
    moe.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    with open(data, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"input": p, "label": ""}) + "\n" for p in PROMPTS)
    out = {}
    for arm in args.arms:
        rows, wall = run(model_dir, data, arm, args, tmp)
        out[arm] = {"flags": list(ARMS[arm]), "wall_s": round(wall, 1), "steps": rows,
                    "summary": _summary(rows)}
        print(arm, json.dumps(out[arm]["summary"]), f"{wall:.0f} s", flush=True)
    return out


def _summary(rows: list[dict]) -> dict:
    def mean(key):
        return statistics.fmean(r[key] for r in rows)

    return {"replayed_routing_mismatch_mean": mean("train/moe_replayed_routing_mismatch"),
            "routing_mismatch_mean": mean("train/moe_routing_mismatch"),
            "logprob_abs_diff_mean": mean("rollout/logprob_abs_diff"),
            "logprob_abs_diff_max_mean": mean("rollout/logprob_abs_diff_max"),
            "logprob_abs_diff_max_max": max(r["rollout/logprob_abs_diff_max"] for r in rows),
            "mismatch_k3_mean": mean("rollout/mismatch_k3"),
            "reward_first": rows[0]["rollout/raw_reward"],
            "reward_last": rows[-1]["rollout/raw_reward"],
            "reward_mean_last_4": statistics.fmean(r["rollout/raw_reward"] for r in rows[-4:])}


def _decode(model, tok, args, bf16: bool):
    """The engine's decode of one batch of 16 rows (4 prompts x 4) at the sampler's precision."""
    import torch

    from relax.precision import autocast
    from relax.rollout.generation.generate import generate, tokenize_prompts

    ids, mask = tokenize_prompts(tok, [p for p in PROMPTS[:4] for _ in range(4)], "cpu")
    with torch.no_grad(), autocast(torch.device("cpu"), bf16):
        return generate(model, ids, mask, max_new_tokens=args.new_tokens,
                        eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                        generator=torch.Generator().manual_seed(args.seed))


def bf16(args) -> dict:
    """How bf16 autocast computes here, and what it costs the sampler."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(256, 64, generator=gen), torch.randn(192, 64, generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, w)
    exact = (x.bfloat16().double() @ w.bfloat16().double().T).bfloat16()
    tok, moe = _moe(args.seed)
    times: dict[str, list[float]] = {"bf16": [], "fp32": []}
    for _ in range(args.cost_repeats // 3 or 1):
        for name in times:
            start = time.perf_counter()
            _decode(moe, tok, args, name == "bf16")
            times[name].append(time.perf_counter() - start)
    flags = open("/proc/cpuinfo", encoding="utf-8").read().split()
    return {"output_dtype": str(y.dtype),
            "correctly_rounded_share": (y == exact).double().mean().item(),
            "largest_relative_error_in_bf16_eps": ((y.double() - exact.double()).abs()
                                           / torch.finfo(torch.bfloat16).eps
                                           / exact.double().abs().clamp_min(1e-30)).max().item(),
            "cpu_bf16_instructions": sorted({f for f in flags if "bf16" in f}),
            "decode_s": times, "decode_median_s": {k: statistics.median(v)
                                                   for k, v in times.items()}}


def cost(args) -> dict:
    """One update step of each model on the same sampled batch, alternated."""
    import torch

    from relax.trainer.policy.experience import experience_from_rollout
    from relax.trainer.policy.logprobs import response_log_probs

    tok, moe = _moe(args.seed)
    dense = _dense(tok, moe, args.seed)
    exp = experience_from_rollout(_decode(moe, tok, args, bf16=False))
    models = {"moe": moe, "dense": dense}
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-6) for k, m in models.items()}
    times: dict[str, list[float]] = {k: [] for k in models}

    def step(name):
        start = time.perf_counter()
        lp, _ = response_log_probs(models[name], exp, layout="packed")
        (-(lp * exp.response_mask).sum()).backward()
        optims[name].step()
        optims[name].zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for name in models:  # one warm-up each (allocator, first-call dispatch)
        step(name)
    for _ in range(args.cost_repeats):
        for name in models:
            times[name].append(step(name))
    count = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
    return {"threads": torch.get_num_threads(), "rows": len(exp),
            "response_tokens": int(exp.response_mask.sum()),
            "parameters": count, "seconds": times,
            "median_s": {k: statistics.median(v) for k, v in times.items()},
            "ratio_moe_over_dense": statistics.median(times["moe"]) /
            statistics.median(times["dense"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", nargs="+", choices=("runs", "bf16", "cost"),
                    default=["runs", "bf16", "cost"])
    ap.add_argument("--arms", nargs="+", choices=tuple(ARMS), default=list(ARMS))
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--cost-repeats", type=int, default=15)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sys.path.insert(0, REPO)
    import torch
    import transformers

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    result = {"argv": sys.argv[1:], "commit": commit,
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "torch": torch.__version__, "transformers": transformers.__version__}
    result["wall_s"] = walls = {}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if "runs" in args.parts:
            result["runs"] = runs(args, tmp)
            walls["runs"] = round(time.perf_counter() - start, 1)
    if "bf16" in args.parts:
        begin = time.perf_counter()
        result["bf16"] = bf16(args)
        walls["bf16"] = round(time.perf_counter() - begin, 1)
        print("bf16", json.dumps(result["bf16"]["decode_median_s"]), flush=True)
    if "cost" in args.parts:
        begin = time.perf_counter()
        result["cost"] = cost(args)
        walls["cost"] = round(time.perf_counter() - begin, 1)
        print("cost", json.dumps(result["cost"]["median_s"]), flush=True)
    walls["total"] = round(time.perf_counter() - start, 1)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
