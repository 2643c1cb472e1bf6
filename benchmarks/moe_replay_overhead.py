"""What R3's router hooks cost: five packed forward + backward passes of the tiny MoE over one
sampled batch (16 rows), without and with routing replay, alternated six times, medians in
seconds (docs/moe.md, "Cost of replay"). Not part of the test suite::

    PYTHONPATH=. .venv/bin/python benchmarks/moe_replay_overhead.py
"""

from __future__ import annotations

import time

import torch

from relax.rollout.generation.generate import generate, tokenize_prompts
from relax.tiny_model import build_tiny_moe, build_tokenizer
from relax.trainer.policy.experience import experience_from_rollout
from relax.trainer.policy.logprobs import response_log_probs
from relax.trainer.terms.routing_replay import RoutingReplay


def main() -> None:
    torch.set_num_threads(1)
    tok = build_tokenizer()
    model = build_tiny_moe(tok, seed=1)
    ids, mask = tokenize_prompts(tok, [p for p in ("12+3=", "ab=", "x=", "7*7=")
                                       for _ in range(4)], "cpu")
    r = generate(model, ids, mask, max_new_tokens=16, eos_token_ids=[1], pad_token_id=0,
                 generator=torch.Generator().manual_seed(3))
    exp = experience_from_rollout(r)
    replay = RoutingReplay(model, None)
    times: dict = {None: [], "rollout": []}
    for _ in range(6):
        for mode in times:
            replay.mode = mode
            start = time.perf_counter()
            for _ in range(5):
                response_log_probs(model, exp, layout="packed")[0].sum().backward()
            times[mode].append(time.perf_counter() - start)
    print({"none" if k is None else "r3": sorted(v)[len(v) // 2] for k, v in times.items()})


if __name__ == "__main__":
    main()
