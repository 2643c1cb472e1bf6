#!/usr/bin/env bash
# Activation recompute on the real model: activation recompute as an A, B, A, B run of
# benchmarks/ab_step_time.py (medians over steps 2..N of each run, then over the repeats).
# A: no recompute; B: --recompute-granularity full (every decoder layer keeps only its input
# and runs again in the backward pass). Same code state, same seed.
#
#   1. the configuration of the issue: SmolLM2-135M-Instruct, 16 responses (2 prompts x 8
#      samples) of up to 256 tokens in one micro-batch, REINFORCE++-baseline with the k2 KL
#      loss, fp32 (--no-bf16): perf/peak_memory_gb (the process's peak: RSS on the CPU, the
#      allocator's peak on CUDA) and perf/step_time / perf/update_time (the recompute's cost);
#   2. with HOST=1 instead, recompute on in both arms: A keeps glibc's dynamic memory-map
#      threshold (the default), B fixes it at 128 KiB (--host-mmap-threshold-kb 128,
#      relax/host_memory.py): what the allocator's retained memory adds to the peak, and what
#      returning it costs;
#   3. with LONG=1, 32 responses of up to 512 tokens (4 prompts x 8 samples), the size that
#      should train within 24 GiB with recompute; B alone shows whether it fits, A how far
#      it is over.
#
#   MODEL_DIR=models/SmolLM2-135M-Instruct bash benchmarks/recompute_memory.sh
#
# Run it on a quiet machine: a second job on the cores moves the step times, not the memory.
# Results: docs/performance.md.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
REPEATS=${REPEATS:-2}
TASK='reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false&size=64'
COMMON=(--hf-checkpoint "${MODEL_DIR}" --prompt-data "${TASK}" --reasoning-gym-answer last_number
        --apply-chat-template --n-samples-per-prompt 8 --no-bf16
        --num-rollout "${NUM_ROLLOUT:-3}" --rollout-temperature 1.0 --lr 2e-5 --seed 1
        --advantage-estimator reinforce_plus_plus_baseline --normalize-advantages --kl-coef 0
        --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01)
RECOMPUTE=${RECOMPUTE:-"--recompute-granularity full"}

if [[ "${HOST:-0}" == 1 ]]; then
  echo "## 16 x 256 tokens, fp32, ${RECOMPUTE}: A the default, B --host-mmap-threshold-kb 128"
  "${PYTHON}" benchmarks/ab_step_time.py --a . --b . --repeats "${REPEATS}" \
    --a-flags "${RECOMPUTE}" --b-flags "${RECOMPUTE} --host-mmap-threshold-kb 128" \
    -- "${COMMON[@]}" --rollout-batch-size 2 --rollout-max-response-len 256 --micro-batch-size 16
  exit 0
fi

echo "## 16 x 256 tokens, fp32, one micro-batch: A none, B ${RECOMPUTE}"
"${PYTHON}" benchmarks/ab_step_time.py --a . --b . --repeats "${REPEATS}" \
  --b-flags "${RECOMPUTE}" \
  -- "${COMMON[@]}" --rollout-batch-size 2 --rollout-max-response-len 256 --micro-batch-size 16

if [[ "${LONG:-0}" == 1 ]]; then
  echo
  echo "## 32 x 512 tokens, fp32, one micro-batch: A none, B ${RECOMPUTE}"
  "${PYTHON}" benchmarks/ab_step_time.py --a . --b . --repeats 1 \
    --b-flags "${RECOMPUTE}" \
    -- "${COMMON[@]}" --rollout-batch-size 4 --rollout-max-response-len 512 --micro-batch-size 32
fi
