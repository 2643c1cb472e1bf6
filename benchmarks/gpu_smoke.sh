#!/usr/bin/env bash
# GPU smoke benchmark (issue 6): a short bf16 GRPO training of the built-in setup scaled up.
#
#   bash benchmarks/gpu_smoke.sh            # PY=/path/to/python to pick the interpreter
#
# The built-in tiny Qwen3 architecture and character tokenizer of relax.rollout.tiny_model at
# hidden 1024 / 8 layers (~100M parameters) are saved to a temporary directory, then
# `relax train --hf-checkpoint` trains it on the built-in `copy` task: 10 rollout steps of
# 32 prompts x 8 samples, up to 128 new tokens, one optimizer step per rollout, GRPO. On CUDA
# Relax keeps fp32 master weights and runs the forward passes under bf16 autocast. Prints the
# median step time (steps 2..N), generated tokens/s and peak GPU memory. Budget: well inside
# 5 minutes on one GPU (the run itself is capped at 240 s by `timeout`).
#
# Needs a CUDA build of torch and a visible GPU: without one it stops at once with a message
# (exit 1). It has not been run yet: no GPU was available when it was written (see
# docs/performance.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
[ -x "$PY" ] || PY=python3

if ! "$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    sys.exit(f"gpu_smoke.sh: no CUDA device visible (torch {torch.__version__} is {build}); "
             "this benchmark needs a GPU")
print(f"gpu_smoke.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}")
EOF
then
    exit 1
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/relax-gpu-smoke.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

"$PY" - "$WORK/model" <<'EOF'
import sys
from relax.rollout.tiny_model import build_tiny_model, build_tokenizer
tok = build_tokenizer()
model = build_tiny_model(tok, seed=1, hidden_size=1024, intermediate_size=3072,
                         num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                         head_dim=64, max_position_embeddings=512)
model.save_pretrained(sys.argv[1])
tok.save_pretrained(sys.argv[1])
print(f"model: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
      "hidden 1024, 8 layers")
EOF

timeout 240 "$PY" -m relax train --hf-checkpoint "$WORK/model" --builtin-task copy \
    --advantage-estimator grpo --rollout-batch-size 32 --n-samples-per-prompt 8 \
    --rollout-max-response-len 128 --num-rollout 10 --lr 1e-5 --device cuda \
    --output-dir "$WORK/run"

"$PY" - "$WORK/run/metrics.jsonl" <<'EOF'
import json
import statistics
import sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8")]
later = rows[1:] or rows  # step 1 pays for CUDA kernels' first-use set-up
step = statistics.median(r["perf/step_time"] for r in later)
tokens = statistics.median(r["perf/generated_tokens_per_s"] for r in later)
phases = {k[5:-5]: statistics.median(r[k] for r in later) for k in rows[0]
          if k.startswith("perf/") and k.endswith("_time") and k != "perf/step_time"}
print(f"step time {step:.3f} s (median of steps 2..{len(rows)}), generated tokens/s "
      f"{tokens:.0f}, peak GPU memory {max(r['perf/peak_memory_gb'] for r in rows):.2f} GiB")
print("phases (s): " + ", ".join(f"{k} {v:.3f}" for k, v in sorted(phases.items())))
print(f"reward: step 1 {rows[0]['rollout/raw_reward']:.3f}, "
      f"step {len(rows)} {rows[-1]['rollout/raw_reward']:.3f}")
EOF
