#!/usr/bin/env bash
# KV reuse across turns: time per step of gem's GuessTheNumber episodes on SmolLM2-135M-Instruct (the
# recipe of docs/reports/guess-the-number-smollm2.md, REINFORCE++-baseline, 4 games x 8
# episodes, up to 4 turns of 32 tokens), A: a checkout from before KV reuse (every turn
# prefills the whole conversation) against B: this one (each episode's KV cache kept between
# turns), same seed. A and B run at the same time with one thread each (OMP_NUM_THREADS=1), so
# both see the same machine; the table gives the median of steps 2..NUM_ROLLOUT (step 1 warms
# up) of each phase, and B / A.
#
#   git archive c93687d | (mkdir -p /tmp/relax-a && tar -x -C /tmp/relax-a)
#   git archive HEAD | (mkdir -p /tmp/relax-b && tar -x -C /tmp/relax-b)
#   A=/tmp/relax-a B=/tmp/relax-b bash benchmarks/kv_reuse_ab.sh
#
# Results: docs/performance.md ("KV reuse across turns").
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
A=${A:?A: a directory holding a checkout from before KV reuse}
B=${B:-${HERE}}
NUM_ROLLOUT=${NUM_ROLLOUT:-4}
SEED=${SEED:-1}
ROOT=$(mkdir -p "${ROOT:-runs/kv-reuse-ab}" && cd "${ROOT:-runs/kv-reuse-ab}" && pwd)
MODEL_DIR=$(cd "${MODEL_DIR:-${HERE}/models/SmolLM2-135M-Instruct}" && pwd)
PYTHON=${PYTHON:-python3}

run_arm() {  # name checkout: each arm imports its own checkout's relax
  rm -rf "${ROOT}/$1"
  (cd "$2" && OMP_NUM_THREADS=1 PYTHONPATH="$2" "${PYTHON}" -m relax train \
    --advantage-estimator reinforce_plus_plus_baseline --normalize-advantages --kl-coef 0 \
    --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01 \
    --env "${HERE}/examples/envs/gem_last_number.py:guess_the_number_easy" --max-turns 4 \
    --apply-chat-template --hf-checkpoint "${MODEL_DIR}" --num-rollout "${NUM_ROLLOUT}" \
    --rollout-batch-size 4 --n-samples-per-prompt 8 --micro-batch-size 16 \
    --rollout-max-response-len 32 --rollout-temperature 1.0 --lr 2e-5 --eps-clip 0.2 \
    --clip-grad 1.0 --seed "${SEED}" --log-samples 0 --output-dir "${ROOT}/$1" \
    > "${ROOT}/$1.log" 2>&1)
}

start=$(date +%s)
run_arm A "${A}" &
a=$!
run_arm B "${B}" &
b=$!
wait "${a}" "${b}"
echo "A and B: $(( $(date +%s) - start )) s" | tee -a "${ROOT}/walltimes.txt"

"${PYTHON}" - "${ROOT}" <<'PY'
import json, statistics, sys
root = sys.argv[1]
rows = {}
for arm in ("A", "B"):
    with open(f"{root}/{arm}/metrics.jsonl", encoding="utf-8") as f:
        rows[arm] = [json.loads(line) for line in f if line.strip()][1:]  # step 1 warms up
keys = ["perf/generate_time", "perf/reward_time", "perf/rollout_time", "perf/log_prob_time",
        "perf/update_time", "perf/train_time", "perf/step_time", "perf/peak_memory_gb",
        "rollout/episode_turns", "rollout/response_length", "rollout/raw_reward"]
print(f"| metric (median of steps 2..{len(rows['A']) + 1}) | A: re-prefill | B: KV reuse | B / A |")
print("|---|---:|---:|---:|")
for k in keys:
    if all(k in r for arm in rows for r in rows[arm]):
        a, b = (statistics.median(r[k] for r in rows[arm]) for arm in ("A", "B"))
        print(f"| {k} | {a:.3f} | {b:.3f} | {b / a if a else float('nan'):.3f} |")
for arm in ("A", "B"):
    print(arm, "generate per step:", [round(r["perf/generate_time"], 1) for r in rows[arm]])
PY
