#!/usr/bin/env bash
# Token-budget micro-batches and LoRA on the real model, each as an A, B, A, B run of
# benchmarks/ab_step_time.py (medians over steps 2..N of each run, then over the repeats):
#
#   1. token-budget micro-batches: fixed micro-batches of 8 rows (A) vs
#      --use-dynamic-batch-size --max-tokens-per-gpu 1536 (B: 8 rows of 192 tokens, the worst
#      case of a fixed micro-batch of 8 with a 64-token prompt), responses capped at 128 tokens
#      on reasoning-gym sums (most answers are short, some run to the cap): padding fraction
#      of the update passes, update-phase and step time;
#   2. LoRA: full fine-tuning (A) vs --lora-rank 16 --lora-alpha 32 (B) at the same batch and
#      micro-batch (16 rows; LORA_MICRO_BATCHES="16 4" adds 4: activations scale with the
#      micro-batch, the parameter-sized state LoRA removes does not): peak memory (the
#      process's peak RSS on the CPU) and step time.
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash benchmarks/batching_and_lora.sh
#
# Both runs of a pair use the REINFORCE++-baseline recipe (a KL term, so full fine-tuning keeps
# a reference copy of the weights) and the same seed. Results: docs/performance.md.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
REPEATS=${REPEATS:-2}
TASK='reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false&size=64'
COMMON=(--hf-checkpoint "${MODEL_DIR}" --prompt-data "${TASK}" --reasoning-gym-answer last_number
        --apply-chat-template --rollout-batch-size 4 --n-samples-per-prompt 8
        --num-rollout "${NUM_ROLLOUT:-3}" --rollout-temperature 1.0 --lr 2e-5 --seed 1
        --advantage-estimator reinforce_plus_plus_baseline --normalize-advantages --kl-coef 0
        --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01)

echo "## token-budget micro-batches"
"${PYTHON}" benchmarks/ab_step_time.py --a . --b . --repeats "${REPEATS}" \
  --b-flags "--use-dynamic-batch-size --max-tokens-per-gpu 1536" \
  -- "${COMMON[@]}" --rollout-max-response-len 128 --micro-batch-size 8
for mb in ${LORA_MICRO_BATCHES:-16}; do
  echo
  echo "## LoRA, micro-batch ${mb}"
  "${PYTHON}" benchmarks/ab_step_time.py --a . --b . --repeats "${REPEATS}" \
    --b-flags "--lora-rank 16 --lora-alpha 32" \
    -- "${COMMON[@]}" --rollout-max-response-len 64 --micro-batch-size "${mb}"
done
