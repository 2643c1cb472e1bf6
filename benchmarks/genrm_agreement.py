"""How often a generative judge (``--rm-type genrm``) agrees with a verifier, and what it costs.

The policy answers reasoning-gym sums (the README's real-model task) as a training step would
(chat template, ``--reasoning-gym-answer last_number``, sampling at temperature 1); the judge
-- by default the same model directory, judging its own answers -- scores each answer through
the judging template with the trainer's own judge (relax/rollout/reward/judge.py: one batched greedy
decode per step); the reasoning-gym verifier gives the truth. Prints one JSON object: agreement,
the confusion counts, the share of answers without a verdict, and seconds per step of the
policy's generation and of the judge.

    OMP_NUM_THREADS=1 python benchmarks/genrm_agreement.py --model models/SmolLM2-135M-Instruct \\
        --steps 4 --prompts 4 --samples 8

``--ab-sharing`` judges every step's samples twice, A: each judging prompt prefilled whole
(``--pass-layout packed`` / ``padded``), then B: a question's judging prompts prefilling their
common beginning once (``shared-prefix``, the default; relax/rollout/generation/shared_prefix.py),
and reports the medians of each one's process CPU seconds (which other processes' load does
not stretch, unlike wall seconds) and wall seconds per step, whether their verdicts are equal,
and the judging prompts' tokens against those the shared prefill computes. The agreement
counts are B's.

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from relax import models
from relax.config.sections import DataSection, RewardsSection, RolloutSection
from relax.rollout.generation.generate import tokenize_prompts
from relax.rollout.generation.sampler import Sampler, SamplingParams
from relax.rollout.generation.shared_prefix import shared_prefixes
from relax.rollout.prompts.data import format_prompt, load_source
from relax.rollout.prompts.reasoning_gym_source import make_reward
from relax.rollout.reward.judge import build_judge

SPEC = ("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3"
        "&operators=+&allow_parentheses=false&allow_negation=false&size=80")


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="the policy's model directory")
    parser.add_argument("--judge", help="the judge's model directory (default: --model)")
    parser.add_argument("--template", help="a --genrm-prompt-template file")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--samples", type=int, default=4, help="samples per prompt")
    parser.add_argument("--max-response-len", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0,
                        help="the policy's; 0 is greedy (one distinct answer per prompt)")
    parser.add_argument("--judge-max-len", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--show", type=int, default=3, help="verdicts to print per step")
    parser.add_argument("--ab-sharing", action="store_true",
                        help="judge each step unshared (A) then prefix-shared (B); see above")
    return parser.parse_args()


def _build(args, device):
    """The prompts, the policy's tokenizer and sampler, and the judge."""
    cfg = RolloutSection(data=DataSection(reasoning_gym_answer="last_number"))
    items = load_source(SPEC, "--prompt-data", cfg, role="train")
    tokenizer = models.load_tokenizer(args.model)
    policy = models.load_policy(args.model, tokenizer, device, seed=args.seed).eval()
    sampler = Sampler(policy, eos_token_ids=models.eos_token_ids(tokenizer, policy),
                      pad_token_id=tokenizer.pad_token_id, params=SamplingParams(args.temperature),
                      bf16=False, device=device)
    judge = build_judge(RewardsSection(
        rm_type="genrm", genrm_model_path=args.judge or args.model,
        genrm_prompt_template=args.template, genrm_max_response_len=args.judge_max_len),
        device, bf16=False)
    return items, tokenizer, sampler, judge


def main() -> None:
    args = _parse_args()
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    items, tokenizer, sampler, judge = _build(args, device)
    truth_fn = make_reward("last_number")
    counts = {"tp": 0, "fp": 0, "tn": 0, "fn": 0}
    unparsed, gen_s, judge_s = 0, [], []
    ab = {"A": [], "B": [], "equal": [], "tokens": [], "computed": []}
    generator = torch.Generator().manual_seed(args.seed)
    for step in range(args.steps):
        batch = items[step * args.prompts:(step + 1) * args.prompts]
        texts = [format_prompt(tokenizer, s.prompt, apply_chat_template=True, system_prompt=None)
                 for s in batch for _ in range(args.samples)]
        labels = [s.label for s in batch for _ in range(args.samples)]
        start = time.perf_counter()
        ids, mask = tokenize_prompts(tokenizer, texts, device)
        rollout = sampler(ids, mask, args.max_response_len, generator)
        responses = tokenizer.batch_decode(rollout.response_ids, skip_special_tokens=True)
        gen_s.append(time.perf_counter() - start)
        truth = truth_fn(texts, responses, labels)
        start = time.perf_counter()
        verdicts = (_ab_step(judge, texts, responses, labels, ab) if args.ab_sharing else
                    judge(texts, responses, labels))
        judge_s.append(time.perf_counter() - start if not args.ab_sharing else ab["B"][-1][1])
        unparsed += judge.unparsed
        for t, v in zip(truth, verdicts, strict=True):
            key = ("t" if (v >= 0.5) == (t >= 1.0) else "f") + ("p" if v >= 0.5 else "n")
            counts[key] += 1
        for i in range(min(args.show, len(responses))):
            print(json.dumps({"step": step, "response": responses[i][-80:], "truth": truth[i],
                              "verdict": judge.last_verdicts[i]}))
    total = sum(counts.values())
    print(json.dumps({
        "samples": total, "agreement": (counts["tp"] + counts["tn"]) / total, **counts,
        "verifier_correct_share": (counts["tp"] + counts["fn"]) / total,
        "judge_yes_share": (counts["tp"] + counts["fp"]) / total,
        "unparsed_share": unparsed / total,
        "generate_s_per_step": sum(gen_s) / len(gen_s),
        "judge_s_per_step": sum(judge_s) / len(judge_s),
        "threads": torch.get_num_threads(), "temperature": args.temperature,
        "template": args.template or "default",
        **(_ab_summary(ab) if args.ab_sharing else {}),
    }))


def _ab_step(judge, texts, responses, labels, ab) -> list[float]:
    """A (unshared) then B (shared) on one step's samples: process CPU and wall seconds,
    whether the verdicts agree, the prompt tokens and those the shared prefill computes.
    Returns B's rewards (the default judge's: the step's agreement counts)."""
    verdicts = {}
    for name, share in (("A", False), ("B", True)):
        judge.share_prefixes = share
        cpu, wall = time.process_time(), time.perf_counter()
        rewards = judge(texts, responses, labels)
        ab[name].append((time.process_time() - cpu, time.perf_counter() - wall))
        verdicts[name] = list(judge.last_verdicts)
    ab["equal"].append(verdicts["A"] == verdicts["B"])
    rows = [judge.tokenizer(judge.judging_prompt(p, r, y), add_special_tokens=False)["input_ids"]
            for p, r, y in zip(texts, responses, labels, strict=True)]
    shared = shared_prefixes(rows, texts)
    total = sum(len(r) for r in rows)
    ab["tokens"].append(total)
    ab["computed"].append(total - (0 if shared is None else shared.saved_tokens()))
    return rewards


def _ab_summary(ab) -> dict:
    def median(name, i):
        return statistics.median(x[i] for x in ab[name])

    return {"ab_cpu_s_unshared": median("A", 0), "ab_cpu_s_shared": median("B", 0),
            "ab_wall_s_unshared": median("A", 1), "ab_wall_s_shared": median("B", 1),
            "ab_cpu_s_each": {k: [round(x[0], 2) for x in ab[k]] for k in ("A", "B")},
            "ab_verdicts_equal": all(ab["equal"]),
            "judging_prompt_tokens_per_step": statistics.mean(ab["tokens"]),
            "shared_prefill_tokens_per_step": statistics.mean(ab["computed"])}


if __name__ == "__main__":
    main()
