#!/usr/bin/env python3
"""Peak memory and time of one update micro-batch (forward + backward of the log-probs and
entropy) with full logits vs the chunked output layer, fp32 vs --bf16, on a real-size model.

    python benchmarks/logprob_memory.py                       # SmolLM2-135M shape, 16 x 256
    python benchmarks/logprob_memory.py --model models/SmolLM2-135M-Instruct --rows 16 \
        --prompt 64 --response 256 --repeats 2

Each measurement runs in its own process (peak RSS is per process: ru_maxrss), variants
alternate A, B, A, B, ... and the table gives medians. Without --model the weights are random
from the SmolLM2-135M-Instruct configuration (vocabulary 49,152): memory and time do not
depend on the weight values. Results: docs/performance.md, "Log-probs without full logits".
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, head_dim=64,
               max_position_embeddings=8192, tie_word_embeddings=True, rope_theta=100000.0)


def measure(args) -> dict:
    import torch

    from relax.trainer.policy import logprobs
    from relax.trainer.policy.logprobs import Experience, response_log_probs

    torch.set_num_threads(args.threads)
    if args.model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    else:
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(LlamaConfig(**SMOLLM2), dtype=torch.float32)
    model.config.use_cache = False
    if args.variant.startswith("full"):
        logprobs._output_layer = lambda inner: None
    g = torch.Generator().manual_seed(1)
    V, B, P, T = model.config.vocab_size, args.rows, args.prompt, args.response
    ids = torch.randint(0, V, (B, P + T), generator=g)
    # distinct prompts per row: the shared-prompt path is not what is measured here
    mask = torch.ones(B, P + T, dtype=torch.long)
    exp = Experience(ids, mask, (mask.cumsum(-1) - 1), torch.ones(B, T, dtype=torch.bool))
    bf16 = args.variant.endswith("bf16")
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    logp, ent = response_log_probs(model, exp, with_entropy=True, entropy_grad=False, bf16=bf16)
    logp.sum().backward()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": args.variant, "seconds": seconds, "peak_gb": peak / 2**20,
            "before_gb": base / 2**20, "logp_mean": float(logp.mean())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--response", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--variants", default="full-fp32,chunked-fp32,full-bf16,chunked-bf16")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(measure(args)))
        return 0
    results: dict[str, list[dict]] = {}
    for r in range(args.repeats):
        for variant in args.variants.split(","):
            cmd = [sys.executable, __file__, "--variant", variant, "--rows", str(args.rows),
                   "--prompt", str(args.prompt), "--response", str(args.response),
                   "--threads", str(args.threads)] + (["--model", args.model] if args.model else [])
            out = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results.setdefault(variant, []).append(row)
            print(f"repeat {r + 1} {variant}: {row['seconds']:.1f} s, peak RSS "
                  f"{row['peak_gb']:.2f} GB (model loaded: {row['before_gb']:.2f} GB)",
                  file=sys.stderr)
    print(f"| variant | fwd+bwd s (median of {args.repeats}) | peak RSS GB | above the loaded "
          "model GB |")
    print("|---|---:|---:|---:|")
    for variant, rows in results.items():
        med = statistics.median
        print(f"| {variant} | {med(r['seconds'] for r in rows):.1f} | "
              f"{med(r['peak_gb'] for r in rows):.2f} | "
              f"{med(r['peak_gb'] - r['before_gb'] for r in rows):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
