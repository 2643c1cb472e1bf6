#!/usr/bin/env bash
# The base model's held-out evaluation, then 3 arms x SEEDS of
# run-smollm2-reasoning-gym.sh, one after another (each run uses both cores), then the table.
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash examples/reasoning_gym/sweep-smollm2-reasoning-gym.sh
#   SEEDS="1 2 3" ARMS="grpo" bash examples/reasoning_gym/sweep-smollm2-reasoning-gym.sh
#
# Every variable of run-smollm2-reasoning-gym.sh applies. Output: runs/smollm2-rg/<arm>-seed<S>
# (metrics.jsonl, samples.jsonl), runs/smollm2-rg/base/eval_metrics.json and
# runs/smollm2-rg/summary.md. A run whose metrics already hold the last step is not redone.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-runs/smollm2-rg}
SEEDS=${SEEDS:-1 2}
ARMS=${ARMS:-reinforce_plus_plus reinforce_plus_plus_baseline grpo}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
TASK=${TASK:-basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false}
EVAL_SIZE=${EVAL_SIZE:-200}
ANSWER=${ANSWER:-last_number}
NUM_ROLLOUT=${NUM_ROLLOUT:-20}
PYTHON=${PYTHON:-python3}
export MODEL_DIR TASK EVAL_SIZE ANSWER NUM_ROLLOUT PYTHON

if [[ ! -f "${ROOT}/base/eval_metrics.json" ]]; then
  "${PYTHON}" -m relax eval "${MODEL_DIR}" --apply-chat-template --reasoning-gym-answer "${ANSWER}" \
    --eval-prompt-data heldout "reasoning-gym:${TASK}&size=${EVAL_SIZE}" --eval-temperature 0 \
    --eval-max-response-len "${EVAL_MAX_RESPONSE_LEN:-96}" --eval-batch-size 200 \
    --output-dir "${ROOT}/base" > /dev/null
fi
for seed in ${SEEDS}; do
  for arm in ${ARMS}; do
    out="${ROOT}/${arm}-seed${seed}"
    if [[ -f "${out}/metrics.jsonl" ]] && grep -q "\"rollout/step\": ${NUM_ROLLOUT}," "${out}/metrics.jsonl"; then
      continue
    fi
    rm -rf "${out}"
    start=$(date +%s)
    ALGO=${arm} SEED=${seed} OUTPUT_DIR=${out} bash "${HERE}/run-smollm2-reasoning-gym.sh" \
      > "${out}.log" 2>&1
    echo "${arm} seed ${seed}: $(( $(date +%s) - start )) s" | tee -a "${ROOT}/walltimes.txt"
  done
done
"${PYTHON}" "${HERE}/summarize.py" "${ROOT}" | tee "${ROOT}/summary.md"
