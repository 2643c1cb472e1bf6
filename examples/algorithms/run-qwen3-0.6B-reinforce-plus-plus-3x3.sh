#!/usr/bin/env bash
# The same-budget comparison: 3 arms x 3 seeds of run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh,
# one run after another on one GPU, then the curves of all nine runs in one image.
#
#   bash examples/algorithms/run-qwen3-0.6B-reinforce-plus-plus-3x3.sh
#   ROOT=runs/cmp SEEDS="42" ALGOS="grpo" bash examples/algorithms/run-qwen3-0.6B-reinforce-plus-plus-3x3.sh
#
# Every other environment variable (MODEL_DIR, DATA, EVAL_DATA, NUM_ROLLOUT, ..., DRY_RUN)
# goes through to the recipe unchanged.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=${ROOT:-runs/qwen3-0.6B-gsm8k}
ALGOS=${ALGOS:-reinforce_plus_plus reinforce_plus_plus_baseline grpo}
SEEDS=${SEEDS:-42 1234 2026}
PYTHON=${PYTHON:-python3}

read -r -a algos <<< "${ALGOS}"
read -r -a seeds <<< "${SEEDS}"
run_dirs=()
for algo in "${algos[@]}"; do
  for seed in "${seeds[@]}"; do
    out="${ROOT}/${algo}-seed${seed}"
    echo "== ${algo} seed ${seed} -> ${out}"
    ALGO="${algo}" SEED="${seed}" OUTPUT_DIR="${out}" PYTHON="${PYTHON}" \
      bash "${HERE}/run-qwen3-0.6B-1xgpu-reinforce-plus-plus.sh" "$@"
    run_dirs+=("${out}")
  done
done

if [[ "${DRY_RUN:-0}" != "1" ]]; then
  "${PYTHON}" -m relax plot "${run_dirs[@]}" --output "${ROOT}/curves.png" \
    --title "Qwen3-0.6B GSM8K: ${#algos[@]} arms x ${#seeds[@]} seeds"
fi
