#!/usr/bin/env bash
# Qwen3-0.6B on GSM8K, one GPU, one arm of the REINFORCE++ comparison
# (docs/algorithms/reinforce_plus_plus.md, Recipes).
#
#   ALGO=reinforce_plus_plus          bash examples/algorithms/run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh
#   ALGO=reinforce_plus_plus_baseline SEED=1234 bash examples/algorithms/run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh
#   ALGO=grpo DRY_RUN=1               bash examples/algorithms/run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh
#
# The three arms share one budget: the published Relax reference setup (50 rollout steps,
# 4 prompts x 8 samples, global batch 32 = one optimizer step per rollout step, responses of
# at most 1024 tokens, constant lr 1e-6, PPO clip 0.2). Only the §8 flags differ:
#
#   reinforce_plus_plus           --normalize-advantages --gamma 1.0 --kl-coef 0.01 --kl-loss-type k1
#   reinforce_plus_plus_baseline  --normalize-advantages --kl-coef 0 --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01
#   grpo                          the grpo defaults (group std scaling, token PPO clip)
#
# Data: python scripts/prepare_gsm8k.py --output-dir data/gsm8k (question / answer jsonl).
# Every setting below can be changed by environment variable; extra arguments are passed on
# to `relax train` (e.g. --use-tensorboard). The 3 arms x 3 seeds sweep is
# run-qwen3-0.6B-reinforce-plus-plus-3x3.sh next to this file.
set -euo pipefail

ALGO=${ALGO:-reinforce_plus_plus}
MODEL_DIR=${MODEL_DIR:-models/Qwen3-0.6B}
DATA=${DATA:-data/gsm8k/train.jsonl}
EVAL_DATA=${EVAL_DATA-data/gsm8k/test.jsonl}  # set to "" for no evaluation
SEED=${SEED:-42}
NUM_ROLLOUT=${NUM_ROLLOUT:-50}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-4}
N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
GLOBAL_BATCH_SIZE=${GLOBAL_BATCH_SIZE:-32}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-8}  # memory only: the loss is the same (§7)
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-1024}
LR=${LR:-1e-6}
EVAL_INTERVAL=${EVAL_INTERVAL:-25}
N_SAMPLES_PER_EVAL_PROMPT=${N_SAMPLES_PER_EVAL_PROMPT:-1}
EVAL_TEMPERATURE=${EVAL_TEMPERATURE:-0}
EVAL_BATCH_SIZE=${EVAL_BATCH_SIZE:-256}
SYSTEM_PROMPT=${SYSTEM_PROMPT:-'Please reason step by step, and put your final answer within \boxed{}.'}
OUTPUT_DIR=${OUTPUT_DIR:-runs/qwen3-0.6B-gsm8k/${ALGO}-seed${SEED}}
SAVE=${SAVE:-}  # a directory to save the final model to; empty: no checkpoint
PYTHON=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}

case "${ALGO}" in
  reinforce_plus_plus)
    ALGO_ARGS=(--advantage-estimator reinforce_plus_plus --normalize-advantages
               --gamma 1.0 --kl-coef 0.01 --kl-loss-type k1) ;;
  reinforce_plus_plus_baseline)
    ALGO_ARGS=(--advantage-estimator reinforce_plus_plus_baseline --normalize-advantages
               --kl-coef 0 --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01) ;;
  grpo)
    ALGO_ARGS=(--advantage-estimator grpo) ;;
  *)
    echo "ALGO=${ALGO}: choose reinforce_plus_plus, reinforce_plus_plus_baseline or grpo" >&2
    exit 2 ;;
esac

ARGS=(
  "${ALGO_ARGS[@]}"
  --hf-checkpoint "${MODEL_DIR}"
  --prompt-data "${DATA}" --input-key question --label-key answer --rollout-shuffle
  --apply-chat-template --system-prompt "${SYSTEM_PROMPT}" --rm-type math
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}"
  --global-batch-size "${GLOBAL_BATCH_SIZE}"
  --micro-batch-size "${MICRO_BATCH_SIZE}"
  --rollout-max-response-len "${MAX_RESPONSE_LEN}"
  --rollout-temperature 1.0
  --lr "${LR}" --eps-clip 0.2 --clip-grad 1.0
  --seed "${SEED}"
  --output-dir "${OUTPUT_DIR}"
)
if [[ -n "${EVAL_DATA}" ]]; then
  ARGS+=(--eval-interval "${EVAL_INTERVAL}" --eval-prompt-data gsm8k "${EVAL_DATA}"
         --n-samples-per-eval-prompt "${N_SAMPLES_PER_EVAL_PROMPT}"
         --eval-temperature "${EVAL_TEMPERATURE}" --eval-batch-size "${EVAL_BATCH_SIZE}")
fi
if [[ -n "${SAVE}" ]]; then
  ARGS+=(--save "${SAVE}")
fi
if [[ "${DRY_RUN}" == "1" ]]; then
  ARGS+=(--dry-run)
fi

exec "${PYTHON}" -m relax train "${ARGS[@]}" "$@"
