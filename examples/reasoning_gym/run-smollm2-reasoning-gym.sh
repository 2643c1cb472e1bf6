#!/usr/bin/env bash
# SmolLM2-135M-Instruct on a reasoning-gym task, CPU, one arm of the estimator comparison
# (docs/reports/reasoning-gym-smollm2.md).
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) ALGO=reinforce_plus_plus SEED=1 \
#       bash examples/reasoning_gym/run-smollm2-reasoning-gym.sh
#   ALGO=grpo DRY_RUN=1 bash examples/reasoning_gym/run-smollm2-reasoning-gym.sh
#
# The arms share one budget (4 prompts x 8 samples, one optimizer step per rollout step,
# responses of at most 64 tokens) and differ only in the reinforce_plus_plus.md §8 flags:
#
#   reinforce_plus_plus           --normalize-advantages --gamma 1.0 --kl-coef 0.01 --kl-loss-type k1
#   reinforce_plus_plus_baseline  --normalize-advantages --kl-coef 0 --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01
#   grpo                          the grpo defaults (group std scaling, token PPO clip)
#
# and two arms of their own reports (docs/reports/ppo-smollm2.md, distillation-smollm2.md):
#
#   ppo        --advantage-estimator ppo --normalize-advantages --gamma 1.0 --lambd ${LAMBD}
#              --value-clip ${VALUE_CLIP} --critic-lr ${CRITIC_LR}   (a critic, GAE; §5c)
#   opd_only   --advantage-estimator grpo --use-opd --opd-only --opd-teacher-load ${TEACHER_DIR}
#              --opd-kl-coef ${OPD_KL_COEF}   (distillation alone from a teacher; §7b)
#
# SAVE_DIR=DIR adds --save DIR (the final model, e.g. a distillation teacher after
# `relax export DIR TEACHER_DIR`).
#
# Training questions come from reasoning-gym seeds 0.. and the held-out set from seeds
# 1000000000.. (the source's defaults); the answer is the last number of the reply
# (--reasoning-gym-answer last_number: the model never writes reasoning-gym's <answer> tags).
# Held-out greedy pass@1 is measured at the last step. Every setting is an environment
# variable; extra arguments go to `relax train`. The 3 arms x 2 seeds sweep with the base
# model's evaluation is sweep-smollm2-reasoning-gym.sh next to this file.
set -euo pipefail

ALGO=${ALGO:-reinforce_plus_plus}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
TASK=${TASK:-basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false}
TRAIN_SIZE=${TRAIN_SIZE:-$(( ${NUM_ROLLOUT:-20} * ${ROLLOUT_BATCH_SIZE:-4} ))}  # one pass: every question trained on once
EVAL_SIZE=${EVAL_SIZE:-200}
ANSWER=${ANSWER:-last_number}
SEED=${SEED:-1}
NUM_ROLLOUT=${NUM_ROLLOUT:-20}
ROLLOUT_BATCH_SIZE=${ROLLOUT_BATCH_SIZE:-4}
N_SAMPLES_PER_PROMPT=${N_SAMPLES_PER_PROMPT:-8}
MICRO_BATCH_SIZE=${MICRO_BATCH_SIZE:-16}  # memory only: the loss is the same (§7)
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-64}
LR=${LR:-2e-5}
EVAL_INTERVAL=${EVAL_INTERVAL:-${NUM_ROLLOUT}}
EVAL_MAX_RESPONSE_LEN=${EVAL_MAX_RESPONSE_LEN:-96}
LOG_SAMPLES=${LOG_SAMPLES:-4}
OUTPUT_DIR=${OUTPUT_DIR:-runs/smollm2-rg/${ALGO}-seed${SEED}}
PYTHON=${PYTHON:-python3}
# what runs `-m relax train`: the interpreter, or e.g. "python3 -m torch.distributed.run
# --standalone --nproc_per_node 2" for --fully-async or data-parallel ranks
LAUNCHER=${LAUNCHER:-${PYTHON}}
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
  ppo)
    ALGO_ARGS=(--advantage-estimator ppo --normalize-advantages --gamma 1.0
               --lambd "${LAMBD:-1.0}" --value-clip "${VALUE_CLIP:-0.2}"
               --critic-lr "${CRITIC_LR:-1e-4}") ;;
  opd_only)
    if [[ -z "${TEACHER_DIR:-}" ]]; then
      echo "ALGO=opd_only: set TEACHER_DIR to the teacher's Hugging Face directory" >&2
      exit 2
    fi
    ALGO_ARGS=(--advantage-estimator grpo --use-opd --opd-only
               --opd-teacher-load "${TEACHER_DIR}" --opd-kl-coef "${OPD_KL_COEF:-1.0}") ;;
  *)
    echo "ALGO=${ALGO}: choose reinforce_plus_plus, reinforce_plus_plus_baseline, grpo, ppo or opd_only" >&2
    exit 2 ;;
esac

ARGS=(
  "${ALGO_ARGS[@]}"
  --hf-checkpoint "${MODEL_DIR}"
  --prompt-data "reasoning-gym:${TASK}&size=${TRAIN_SIZE}" --rollout-shuffle
  --reasoning-gym-answer "${ANSWER}" --apply-chat-template
  --num-rollout "${NUM_ROLLOUT}"
  --rollout-batch-size "${ROLLOUT_BATCH_SIZE}"
  --n-samples-per-prompt "${N_SAMPLES_PER_PROMPT}"
  --micro-batch-size "${MICRO_BATCH_SIZE}"
  --rollout-max-response-len "${MAX_RESPONSE_LEN}"
  --rollout-temperature 1.0
  --lr "${LR}" --eps-clip 0.2 --clip-grad 1.0
  --seed "${SEED}"
  --log-samples "${LOG_SAMPLES}"
  --eval-interval "${EVAL_INTERVAL}"
  --eval-prompt-data heldout "reasoning-gym:${TASK}&size=${EVAL_SIZE}"
  --eval-temperature 0 --eval-max-response-len "${EVAL_MAX_RESPONSE_LEN}" --eval-batch-size 200
  --output-dir "${OUTPUT_DIR}"
)
if [[ -n "${SAVE_DIR:-}" ]]; then
  ARGS+=(--save "${SAVE_DIR}")
fi
if [[ "${DRY_RUN}" == 1 ]]; then
  ARGS+=(--dry-run)
fi
# shellcheck disable=SC2086  # the launcher is words
exec ${LAUNCHER} -m relax train "${ARGS[@]}" "$@"
