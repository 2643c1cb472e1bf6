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

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from relax import models
from relax.config.sections import DataSection, RewardsSection, RolloutSection
from relax.rollout.generation.generate import tokenize_prompts
from relax.rollout.generation.sampler import Sampler, SamplingParams
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
        verdicts = judge(texts, responses, labels)
        judge_s.append(time.perf_counter() - start)
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
    }))


if __name__ == "__main__":
    main()
