#!/usr/bin/env bash
# Partial rollouts: held-out pass@1 at equal wall clock, with and without partial rollouts, on
# SmolLM2-135M-Instruct (reasoning-gym sums, responses of up to 256 tokens: a long tail).
#
#   A: --use-tis                                                 (every group decoded to its end)
#   B: --use-tis --partial-rollout --over-sampling-batch-size 8  (train the first 4 of 8 groups
#                                                                 that finish; carry the rest)
#
# For each seed, A and B run at the same time with one thread each (OMP_NUM_THREADS=1), so
# both see the same machine, including whatever else runs on it; each stops at the first step
# that ends MINUTES after it started (--exit-duration-in-mins) and then evaluates greedy
# pass@1 on the held-out questions (reasoning-gym seeds from 1000000000). The table gives,
# per arm and seed, the steps completed, samples trained per minute and pass@1.
#
#   MODEL_DIR=models/SmolLM2-135M-Instruct MINUTES=25 SEEDS="1 2" \
#       bash benchmarks/partial_rollout_pass_at_1.sh
#
# Results: docs/performance.md ("Partial rollouts on SmolLM2").
set -euo pipefail
HERE=${HERE:-$(cd "$(dirname "$0")" && pwd)}
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
MINUTES=${MINUTES:-25}
SEEDS=${SEEDS:-1 2}
ROOT=${ROOT:-runs/partial-pass-at-1}
export PYTHON MODEL_DIR
mkdir -p "${ROOT}"

run_arm() {  # arm seed flags...
  local arm=$1 seed=$2
  shift 2
  OMP_NUM_THREADS=1 ALGO=grpo SEED="${seed}" NUM_ROLLOUT=1000 TRAIN_SIZE=4000 \
    MAX_RESPONSE_LEN=256 MICRO_BATCH_SIZE=8 EVAL_INTERVAL=1000 LOG_SAMPLES=0 \
    OUTPUT_DIR="${ROOT}/${arm}-seed${seed}" \
    bash "${HERE}/../examples/reasoning_gym/run-smollm2-reasoning-gym.sh" \
    --exit-duration-in-mins "${MINUTES}" --use-tis "$@" > "${ROOT}/${arm}-seed${seed}.log" 2>&1
}

for seed in ${SEEDS}; do
  start=$(date +%s)
  run_arm A "${seed}" &
  a=$!
  run_arm B "${seed}" --partial-rollout --over-sampling-batch-size 8 &
  b=$!
  wait "${a}" "${b}"
  echo "seed ${seed}: $(( $(date +%s) - start )) s ($(git rev-parse --short HEAD))" \
    | tee -a "${ROOT}/walltimes.txt"
done

"${PYTHON}" - "${ROOT}" ${SEEDS} <<'EOF'
import json, sys
root, seeds = sys.argv[1], sys.argv[2:]
print("| arm | seed | steps | samples trained / min | generate (s, median) | "
      "step (s, median) | held-out pass@1 |")
print("|---|---:|---:|---:|---:|---:|---:|")
for arm in ("A", "B"):
    for seed in seeds:
        with open(f"{root}/{arm}-seed{seed}/metrics.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        steps = [r for r in rows if "perf/step_time" in r]
        med = lambda k: sorted(r.get(k, float('nan')) for r in steps)[len(steps) // 2]
        minutes = sum(r["perf/step_time"] for r in steps) / 60
        trained = 32 * len(steps)
        pass1 = [r[k] for r in rows for k in r if k.startswith("eval/") and k.endswith("pass@1")]
        print(f"| {arm} | {seed} | {len(steps)} | {trained / minutes:.1f} | "
              f"{med('perf/generate_time'):.1f} | {med('perf/step_time'):.1f} | "
              f"{pass1[-1] if pass1 else float('nan'):.3f} |")
EOF
