"""What routing replay (docs/algorithms/moe.md §M5) does to a mixture-of-experts policy's sampler/trainer
mismatch, and what a MoE step costs against a dense model of the same active size. Not part
of the test suite; written, checked for 2 steps on the tiny MoE, NOT yet measured::

    .venv/bin/python benchmarks/moe_replay.py --out moe.json              # the tiny MoE
    .venv/bin/python benchmarks/moe_replay.py --hf-checkpoint MOE_DIR --steps 20 --out moe.json

Three parts, each printed and written to ``--out``:

1. ``static``: one batch sampled by Relax's engine under bf16 autocast (the sampler), its
   routing recorded; the fp32 trainer's log-probs of the same tokens with the router's own
   routing and with the sampler's (R3). Per arm: the share of (token, MoE layer) pairs whose
   trainer routing differs from the sampler's, and the log-prob mismatch against the
   sampler's (mean and max |diff|, k3). R2 is the first arm at pi_old (it replays the
   trainer's own routing), so it differs from "none" only after the policy moves: part 2.
2. ``runs``: ``relax train --bf16`` for ``--steps`` steps with no replay, R2
   (``--use-routing-replay --num-steps-per-rollout 2``) and R3, the same seed: each step's
   reward and routing / log-prob mismatch metrics (in this tree the sampler and the trainer
   share ``--bf16``; a bf16 sampler against an fp32 trainer needs the vLLM backend, whose
   routing Relax does not read yet: docs/moe.md).
3. ``cost``: ``perf/step_time`` of the MoE run against a dense Qwen3 whose MLP width is the
   active experts' (``k * moe_intermediate_size``), same everything else.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from relax.rollout.generation.generate import generate, tokenize_prompts  # noqa: E402
from relax.tiny_model import build_tiny_model, build_tiny_moe, build_tokenizer  # noqa: E402
from relax.trainer.policy.experience import experience_from_rollout  # noqa: E402
from relax.trainer.policy.logprobs import response_log_probs  # noqa: E402
from relax.trainer.terms.routing_replay import RoutingReplay  # noqa: E402

PROMPTS = ("12+3=", "ab=", "x=", "7*7=", "hello ", "1,2,3,")


def _moe_dir(args, tmp: str) -> str:
    if args.hf_checkpoint:
        return args.hf_checkpoint
    tok = build_tokenizer()
    path = os.path.join(tmp, "tiny_moe")
    build_tiny_moe(tok, seed=args.seed).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _dense_dir(moe_dir: str, tmp: str) -> str:
    """A dense Qwen3 of the MoE's active size: MLP width k * moe_intermediate_size."""
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(moe_dir)
    tok = AutoTokenizer.from_pretrained(moe_dir)
    model = build_tiny_model(tok, seed=0, hidden_size=cfg.hidden_size,
                             intermediate_size=cfg.num_experts_per_tok * cfg.moe_intermediate_size,
                             num_hidden_layers=cfg.num_hidden_layers,
                             num_attention_heads=cfg.num_attention_heads,
                             num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
                             tie_word_embeddings=cfg.tie_word_embeddings)
    path = os.path.join(tmp, "dense_model")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def static(moe_dir: str, args) -> dict:
    """Part 1: one bf16-sampled batch, the fp32 trainer with and without R3."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(moe_dir)
    model = AutoModelForCausalLM.from_pretrained(moe_dir, dtype=torch.float32).eval()
    ids, mask = tokenize_prompts(tok, [p for p in PROMPTS for _ in range(args.samples)], "cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = generate(model, ids, mask, max_new_tokens=args.new_tokens,
                     eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
                     generator=torch.Generator().manual_seed(args.seed))
    exp = experience_from_rollout(r)
    m = exp.response_mask
    out = {}
    for arm, mode in (("none", None), ("r3", "rollout")):
        replay = RoutingReplay(model, mode)
        lp, _ = response_log_probs(model, exp, layout="packed")  # grad on: the metric counts
        from relax.metrics.tracker import MetricTracker

        tracker = MetricTracker()
        replay.after_update(tracker)
        replay.close()
        diff = (lp.detach() - r.log_probs)[m]
        log_ratio = (r.log_probs - lp.detach())[m]
        out[arm] = {**tracker.reduce(), "logprob_abs_diff_mean": diff.abs().mean().item(),
                    "logprob_abs_diff_max": diff.abs().max().item(),
                    "k3": (log_ratio.exp() - 1 - log_ratio).mean().item(),
                    "tokens": int(m.sum())}
    return out


def run(model_dir: str, name: str, args, tmp: str, *flags) -> list[dict]:
    out = os.path.join(tmp, "run_" + name)
    cmd = [sys.executable, "-m", "relax", "train", "--hf-checkpoint", model_dir,
           "--num-rollout", str(args.steps), "--rollout-batch-size", "4",
           "--n-samples-per-prompt", "4", "--rollout-max-response-len", str(args.new_tokens),
           "--advantage-estimator", "grpo", "--lr", "1e-3", "--bf16", "--seed", str(args.seed),
           "--device", "cpu", "--output-dir", out, *flags]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": REPO})
    if proc.returncode:
        raise SystemExit(f"{name}: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


KEEP = ("rollout/raw_reward", "train/moe_routing_mismatch", "train/moe_replayed_routing_mismatch",
        "rollout/logprob_abs_diff", "rollout/mismatch_k3", "perf/step_time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hf-checkpoint", help="a Qwen3-MoE directory (default: the tiny MoE)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        moe = _moe_dir(args, tmp)
        result = {"static": static(moe, args), "runs": {}, "cost": {}}
        arms = {"none": (), "r2": ("--use-routing-replay", "--num-steps-per-rollout", "2"),
                "r3": ("--use-rollout-routing-replay",)}
        for arm, flags in arms.items():
            rows = run(moe, arm, args, tmp, *flags)
            result["runs"][arm] = [{k: r.get(k) for k in KEEP} for r in rows]
        dense = run(_dense_dir(moe, tmp), "dense", args, tmp)
        result["cost"] = {"moe_step_time": [r["perf/step_time"] for r in
                                            result["runs"]["none"]],
                          "dense_step_time": [r["perf/step_time"] for r in dense]}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
