"""Episodes played twice from one generator seed, each turn prefilling the whole conversation
(A, the path before KV reuse) and with each episode's KV cache kept between turns (B): the
generation time of each and how many episodes came out token for token the same.

Not part of the test suite (tests/rollout/generation/test_turn_cache.py proves the ids equal on a tiny
model). On a real model the two paths sum the same floats in another order, so a draw that
falls within rounding of a boundary between two tokens can differ; this counts how often::

    .venv/bin/python benchmarks/kv_reuse_episodes.py --model models/SmolLM2-135M-Instruct \\
        --env examples/envs/gem_last_number.py:guess_the_number_easy --games 4 --plays 8
"""

from __future__ import annotations

import argparse
import time

import torch

from relax import models
from relax.rollout.agents.envs import environment_factory
from relax.rollout.agents.episodes import run_episodes, turn_io
from relax.rollout.generation.sampler import Sampler, SamplingParams


def play(sampler, make_env, seeds, tok, *, reuse: bool, seed: int, max_turns: int,
         turn_tokens: int, eos: int):
    generator = torch.Generator().manual_seed(seed)

    def sample(ids, mask, k, cache=None):
        return sampler(ids, mask, k, generator, cache=cache if reuse else None)

    first, render = turn_io(tok, apply_chat_template=True, system_prompt=None, eos_token_id=eos)
    start = time.perf_counter()
    played = run_episodes([make_env() for _ in seeds], seeds, tokenizer=tok,
                          format_prompt=first, render=render, sample=sample,
                          max_turns=max_turns, max_turn_tokens=turn_tokens, context=None,
                          device="cpu")
    return played, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--env", required=True)
    ap.add_argument("--games", type=int, default=4)
    ap.add_argument("--plays", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    tok = models.load_tokenizer(args.model)
    model = models.load_policy(args.model, tok, torch.device("cpu"), seed=args.seed)
    eos = models.eos_token_ids(tok, model)
    sampler = Sampler(model, eos_token_ids=eos, pad_token_id=tok.pad_token_id,
                      params=SamplingParams(1.0), bf16=False)
    seeds = [1000 + g for g in range(args.games) for _ in range(args.plays)]
    kw = dict(seed=args.seed, max_turns=args.max_turns, turn_tokens=args.turn_tokens,
              eos=eos[0])
    a, a_s = play(sampler, environment_factory(args.env), seeds, tok, reuse=False, **kw)
    b, b_s = play(sampler, environment_factory(args.env), seeds, tok, reuse=True, **kw)
    ra, rb = a.rollout, b.rollout
    same = [bool(torch.equal(ra.response_ids[i][ra.context_mask[i]],
                             rb.response_ids[i][rb.context_mask[i]])) for i in range(len(seeds))]
    print(f"generation: A (whole prefill) {a_s:.1f} s, B (KV reuse) {b_s:.1f} s, "
          f"B / A {b_s / a_s:.3f}")
    print(f"episodes token for token equal: {sum(same)} of {len(same)}; model tokens A "
          f"{int(ra.response_mask.sum())} B {int(rb.response_mask.sum())}; turns A "
          f"{sum(a.turns)} B {sum(b.turns)}")
    if all(same):
        diff = (ra.log_probs - rb.log_probs).abs().max().item()
        print(f"largest sampler log-prob difference: {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
