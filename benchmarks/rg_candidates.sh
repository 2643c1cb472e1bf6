#!/usr/bin/env bash
# Base-model greedy pass@1 of SmolLM2-135M-Instruct on candidate reasoning-gym configurations
# (docs/reports/reasoning-gym-smollm2.md, "Choosing the task"). Usage:
#   MODEL=$(python scripts/fetch_smollm2.py) bash benchmarks/rg_candidates.sh [OUT_DIR]
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct}
OUT=${1:-runs/rg-candidates}
N=${N:-200}
declare -A CANDIDATES=(
  [arith_1d_add]="reasoning-gym:basic_arithmetic?size=$N&min_terms=2&max_terms=2&min_digits=1&max_digits=1&operators=+&allow_parentheses=false&allow_negation=false"
  [arith_2d_add]="reasoning-gym:basic_arithmetic?size=$N&min_terms=2&max_terms=2&min_digits=1&max_digits=2&operators=+&allow_parentheses=false&allow_negation=false"
  [arith_2d_addsub]="reasoning-gym:basic_arithmetic?size=$N&min_terms=2&max_terms=2&min_digits=2&max_digits=2&operators=+,-&allow_parentheses=false&allow_negation=false"
  [arith_2d2d_add]="reasoning-gym:basic_arithmetic?size=$N&min_terms=2&max_terms=2&min_digits=2&max_digits=2&operators=+&allow_parentheses=false&allow_negation=false"
  [arith_1to3d_add]="reasoning-gym:basic_arithmetic?size=$N&min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false"
  [chain_sum_3x1to2d]="reasoning-gym:chain_sum?size=$N&min_terms=3&max_terms=3&min_digits=1&max_digits=2&allow_negation=false"
  [chain_sum_2x2d]="reasoning-gym:chain_sum?size=$N&min_terms=2&max_terms=2&min_digits=2&max_digits=2&allow_negation=false"
  [chain_sum_3x1d]="reasoning-gym:chain_sum?size=$N&min_terms=3&max_terms=3&min_digits=1&max_digits=1&allow_negation=false"
  [leg_counting]="reasoning-gym:leg_counting?size=$N"
  [gsm_symbolic]="reasoning-gym:gsm_symbolic?size=$N"
)
for name in arith_1d_add arith_2d_add arith_2d_addsub arith_2d2d_add arith_1to3d_add chain_sum_3x1d \
    chain_sum_3x1to2d chain_sum_2x2d leg_counting gsm_symbolic; do
  for answer in last_number tags; do
    [[ $answer == tags && $name != arith_2d_add ]] && continue
    start=$(date +%s)
    "$PYTHON" -m relax eval "$MODEL" --apply-chat-template --reasoning-gym-answer "$answer" \
      --eval-prompt-data "$name" "${CANDIDATES[$name]}" --eval-temperature 0 \
      --eval-max-response-len 96 --eval-batch-size 50 --output-dir "$OUT/$name-$answer" > /dev/null
    echo "$name $answer pass@1 $("$PYTHON" -c "import json,sys; m=json.load(open(sys.argv[1])); print(m['eval/$name/pass@1'], 'mean_reward', round(m['eval/$name/mean_reward'],4), 'len', m['eval/$name/response_length'])" "$OUT/$name-$answer/eval_metrics.json") wall $(( $(date +%s) - start )) s"
  done
done
