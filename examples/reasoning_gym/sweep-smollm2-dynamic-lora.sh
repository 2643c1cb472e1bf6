#!/usr/bin/env bash
# The dynamic-sampling and LoRA report (docs/reports/dynamic-sampling-lora-smollm2.md): REINFORCE++-baseline on
# SmolLM2-135M-Instruct and reasoning-gym sums, three arms at the same wall-clock budget
# (--exit-duration-in-mins, model loading included; the final held-out evaluation runs after it):
#
#   full      full fine-tuning, lr 2e-5 (the estimator comparison's setting)
#   dynamic   the same plus dynamic sampling: 8 prompts per round, groups whose 8 rewards are
#             all equal dropped, rounds until 4 groups pass (at most 8 rounds)
#   lora      LoRA rank 16, alpha 32 on every linear layer, lr 2e-4 (10x: adapters want a
#             larger step), reference = the same model with the adapter off
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash examples/reasoning_gym/sweep-smollm2-dynamic-lora.sh
#
# Runs go one after another, seed by seed (full, dynamic, lora for seed 1, then seed 2), so a
# disturbance on the machine spreads over the arms. Every variable of
# run-smollm2-reasoning-gym.sh applies. Output: runs/smollm2-ds-lora/<arm>-seed<S>,
# runs/smollm2-ds-lora/base/eval_metrics.json, walltimes.txt and summary.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-runs/smollm2-ds-lora}
SEEDS=${SEEDS:-1 2}
ARMS=${ARMS:-full dynamic lora}
MINUTES=${MINUTES:-9}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
TASK=${TASK:-basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false}
EVAL_SIZE=${EVAL_SIZE:-200}
ANSWER=${ANSWER:-last_number}
PYTHON=${PYTHON:-python3}
# steps the budget cannot reach; the evaluation runs where the budget ends the run
NUM_ROLLOUT=${NUM_ROLLOUT:-100}
TRAIN_SIZE=${TRAIN_SIZE:-80}  # the estimator report's 80 questions (11 of the 200 held-out ones among them), in epochs
export MODEL_DIR TASK EVAL_SIZE ANSWER NUM_ROLLOUT TRAIN_SIZE PYTHON
mkdir -p "${ROOT}"

if [[ ! -f "${ROOT}/base/eval_metrics.json" ]]; then
  "${PYTHON}" -m relax eval "${MODEL_DIR}" --apply-chat-template --reasoning-gym-answer "${ANSWER}" \
    --eval-prompt-data heldout "reasoning-gym:${TASK}&size=${EVAL_SIZE}" --eval-temperature 0 \
    --eval-max-response-len "${EVAL_MAX_RESPONSE_LEN:-96}" --eval-batch-size 200 \
    --output-dir "${ROOT}/base" > /dev/null
fi
for seed in ${SEEDS}; do
  for arm in ${ARMS}; do
    out="${ROOT}/${arm}-seed${seed}"
    if [[ -f "${out}/metrics.jsonl" ]] && grep -q '"eval/heldout/pass@1"' "${out}/metrics.jsonl"; then
      continue
    fi
    lr=2e-5
    case "${arm}" in
      full) extra=() ;;
      dynamic) extra=(--dynamic-sampling-filter-path nonzero_std --over-sampling-batch-size 8) ;;
      lora) extra=(--lora-rank 16 --lora-alpha 32); lr=2e-4 ;;
      *) echo "ARMS: unknown arm ${arm}; choose full, dynamic, lora" >&2; exit 2 ;;
    esac
    rm -rf "${out}"
    start=$(date +%s)
    ALGO=reinforce_plus_plus_baseline SEED=${seed} LR=${lr} OUTPUT_DIR=${out} \
      bash "${HERE}/run-smollm2-reasoning-gym.sh" --exit-duration-in-mins "${MINUTES}" \
      "${extra[@]}" > "${out}.log" 2>&1
    echo "${arm} seed ${seed}: $(( $(date +%s) - start )) s" | tee -a "${ROOT}/walltimes.txt"
  done
done
"${PYTHON}" "${HERE}/summarize.py" "${ROOT}" | tee "${ROOT}/summary.md"
