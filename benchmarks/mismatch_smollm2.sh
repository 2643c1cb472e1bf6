#!/usr/bin/env bash
# The sampler-trainer mismatch of reinforce_plus_plus.md §7a on SmolLM2-135M-Instruct: fp32,
# --bf16 and LoRA (the engine runs the adapter's layers, training runs peft's). Each arm is
# NUM_ROLLOUT rollout steps of 4 reasoning-gym sums x 8 samples; the table is the mean over
# steps of the metrics the run logs (no extra pass: they come from the update).
#
#   MODEL_DIR=models/SmolLM2-135M-Instruct bash benchmarks/mismatch_smollm2.sh
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
OUT=${OUT:-$(mktemp -d /tmp/relax-mismatch-XXXX)}
mkdir -p "${OUT}"
TASK='reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=3&operators=+&allow_parentheses=false&allow_negation=false&size=64'
COMMON=(--hf-checkpoint "${MODEL_DIR}" --prompt-data "${TASK}" --reasoning-gym-answer last_number
        --apply-chat-template --rollout-batch-size 4 --n-samples-per-prompt 8
        --num-rollout "${NUM_ROLLOUT:-2}" --rollout-max-response-len 64 --micro-batch-size 8
        --rollout-temperature 1.0 --lr 2e-5 --seed 1 --advantage-estimator grpo)

declare -A ARMS=([fp32]="" [bf16]="--bf16" [lora]="--lora-rank 16 --lora-alpha 32 --lr 2e-4")
for arm in fp32 bf16 lora; do
  # shellcheck disable=SC2086  # the arm's flags are words
  "${PYTHON}" -m relax train "${COMMON[@]}" ${ARMS[$arm]} --output-dir "${OUT}/${arm}" \
    > "${OUT}/${arm}.log" 2>&1
done
"${PYTHON}" - "${OUT}" <<'EOF'
import json, statistics, sys
keys = ["rollout/logprob_abs_diff", "rollout/logprob_abs_diff_max", "rollout/mismatch_k1",
        "rollout/mismatch_k3", "rollout/mismatch_ratio_outside"]
print("| arm | " + " | ".join(k.split("/")[1] for k in keys) + " |")
print("|---" * (len(keys) + 1) + "|")
for arm in ("fp32", "bf16", "lora"):
    with open(f"{sys.argv[1]}/{arm}/metrics.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    print(f"| {arm} | " + " | ".join(f"{statistics.mean(r[k] for r in rows):.2e}"
                                    for k in keys) + " |")
EOF
