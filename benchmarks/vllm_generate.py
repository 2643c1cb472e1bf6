"""Generation tokens per second: Relax's decode engine against a vLLM server
(``--rollout-backend vllm``), side by side at equal threads, on one model and batch.

Both sample the same left-padded prompts (a chat-templated reasoning-gym sum each, ``--batch``
of them) at temperature 1 for up to ``--new-tokens`` tokens, in fp32, with ``--threads``
intra-op threads (the engine: ``torch.set_num_threads``; the server: ``OMP_NUM_THREADS``,
threads unbound). The server is Relax's own (started from the model's weights as the trainer
writes them, relax/rollout/backends/vllm/vllm_backend.py), warmed by one batch; then the two alternate
A, B, A, B, ``--repeats`` times each, and the medians are printed as one JSON object with
every measurement. Tokens are the generated ones inside the response mask (each stops at EOS),
so tokens per second compares like with like even where the samples differ.

    python benchmarks/vllm_generate.py --model models/SmolLM2-135M-Instruct --threads 2

Never run by the test suite; needs ``make vllm``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

from relax import models
from relax.config.sections import DataSection, RolloutSection
from relax.rollout.backends.vllm.vllm_backend import VllmBackend, VllmSettings
from relax.rollout.generation.generate import tokenize_prompts
from relax.rollout.generation.sampler import Sampler, SamplingParams
from relax.rollout.prompts.data import format_prompt, load_source

SPEC = ("reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3"
        "&operators=+&allow_parentheses=false&allow_negation=false&size=64")


def _parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    return parser.parse_args()


def _timed(sampler, ids, mask, new_tokens: int, seed: int) -> float:
    start = time.perf_counter()
    rollout = sampler(ids, mask, new_tokens, torch.Generator().manual_seed(seed))
    return int(rollout.response_mask.sum()) / (time.perf_counter() - start)


def main() -> None:
    args = _parse_args()
    torch.set_num_threads(args.threads)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the server inherits it
    tokenizer = models.load_tokenizer(args.model)
    model = models.load_policy(args.model, tokenizer, torch.device("cpu"), seed=0).eval()
    cfg = RolloutSection(data=DataSection(reasoning_gym_answer="last_number"))
    samples = load_source(SPEC, "--prompt-data", cfg, role="train")[:args.batch]
    texts = [format_prompt(tokenizer, s.prompt, apply_chat_template=True, system_prompt=None)
             for s in samples]
    ids, mask = tokenize_prompts(tokenizer, texts, "cpu")
    eos, params = models.eos_token_ids(tokenizer, model), SamplingParams(temperature=1.0)
    engine = Sampler(model, eos_token_ids=eos, pad_token_id=tokenizer.pad_token_id,
                     params=params, bf16=False, device=torch.device("cpu"))
    with tempfile.TemporaryDirectory() as run_dir:
        settings = VllmSettings(urls=None, model_dir=args.model, run_dir=run_dir, seed=0,
                                temperature=1.0, interval=1, startup_timeout=900.0,
                                request_timeout=900.0)
        backend = VllmBackend.open(settings, 0, torch.device("cpu"))
        try:
            started = time.perf_counter()
            backend.start(model, bf16=False)
            startup = time.perf_counter() - started
            server = backend.sampler(params, eos_token_ids=eos,
                                     pad_token_id=tokenizer.pad_token_id)
            _timed(server, ids, mask, args.new_tokens, 0)  # warm-up
            _timed(engine, ids, mask, args.new_tokens, 0)
            runs = {"relax": [], "vllm": []}
            for r in range(args.repeats):
                runs["relax"].append(_timed(engine, ids, mask, args.new_tokens, r + 1))
                runs["vllm"].append(_timed(server, ids, mask, args.new_tokens, r + 1))
        finally:
            backend.close()
    print(json.dumps({
        "model": args.model, "threads": args.threads, "batch": args.batch,
        "new_tokens": args.new_tokens, "vllm_startup_s": round(startup, 1),
        "tokens_per_s": {k: round(statistics.median(v), 1) for k, v in runs.items()},
        "runs": {k: [round(x, 1) for x in v] for k, v in runs.items()},
    }))


if __name__ == "__main__":
    main()
