#!/usr/bin/env bash
# Where a long-response step and an episode step spend their time and memory,
# region by region (benchmarks/profile_step.py: the phases, the reference pass, and the
# update's forward, backward and optimizer step), on SmolLM2-135M-Instruct in fp32.
#
#   1. long responses: 2 reasoning-gym sums x 8 samples at temperature 1.0, up to 1024 tokens,
#      one micro-batch of 16, REINFORCE++-baseline with the k2 KL loss,
#      --recompute-granularity full; STEPS rollout steps (default 2);
#   2. an episode step: gem's GuessTheNumber (examples/envs/gem_last_number.py), 4 games x 8
#      plays, up to 4 turns of 32 tokens, the configuration of benchmarks/kv_reuse_ab.sh.
#
#   MODEL_DIR=models/SmolLM2-135M-Instruct bash benchmarks/profile_long_steps.sh
#   ONLY=long|episode to run one of them; EXTRA="--flag ..." is added to both.
#
# Run it on a quiet machine. Results: docs/performance.md, "Where a long step goes".
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
ROOT=${ROOT:-runs/profile-long-steps}
STEPS=${STEPS:-2}
mkdir -p "${ROOT}"
TASK='reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false&size=64'
ALGO=(--advantage-estimator reinforce_plus_plus_baseline --normalize-advantages --kl-coef 0
      --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01 --no-bf16 --lr 2e-5 --seed 1
      --rollout-temperature 1.0 --apply-chat-template --hf-checkpoint "${MODEL_DIR}"
      --log-samples 0 --num-rollout "${STEPS}")
# shellcheck disable=SC2206  # EXTRA is a list of flags
EXTRA_FLAGS=(${EXTRA:-})

if [[ "${ONLY:-long}" == long ]]; then
  echo "## long responses: 16 x up to 1024 tokens, recompute full"
  rm -rf "${ROOT}/long"
  "${PYTHON}" benchmarks/profile_step.py --json "${ROOT}/long.json" -- "${ALGO[@]}" \
    --prompt-data "${TASK}" --reasoning-gym-answer last_number --n-samples-per-prompt 8 \
    --rollout-batch-size 2 --rollout-max-response-len 1024 --micro-batch-size 16 \
    --recompute-granularity full --output-dir "${ROOT}/long" "${EXTRA_FLAGS[@]}"
fi
if [[ "${ONLY:-episode}" == episode ]]; then
  echo "## episodes: GuessTheNumber, 4 games x 8 plays, up to 4 turns of 32 tokens"
  rm -rf "${ROOT}/episode"
  "${PYTHON}" benchmarks/profile_step.py --json "${ROOT}/episode.json" -- "${ALGO[@]}" \
    --env examples/envs/gem_last_number.py:guess_the_number_easy --max-turns 4 \
    --rollout-batch-size 4 --n-samples-per-prompt 8 --micro-batch-size 16 \
    --rollout-max-response-len 32 --eps-clip 0.2 --clip-grad 1.0 \
    --output-dir "${ROOT}/episode" "${EXTRA_FLAGS[@]}"
fi
