#!/usr/bin/env bash
# --fully-async against the colocated loop on this 2-core machine, at equal
# wall clock. SmolLM2-135M-Instruct, GRPO, the reasoning-gym recipe of
# examples/reasoning_gym/run-smollm2-reasoning-gym.sh (4 sums x 8 samples per step, responses
# of up to 64 tokens); per seed, one after the other (each arm uses both cores):
#
#   A: the colocated loop, one process with two threads (OMP_NUM_THREADS=2)
#   B: torchrun --nproc_per_node 2 --fully-async --max-staleness 1 --use-tis: one training
#      process and one rollout process, one thread each
#
# Each run stops at the first step that ends MINUTES after it started
# (--exit-duration-in-mins) and then evaluates greedy pass@1 on 200 held-out questions. The
# table: steps, samples trained per second of training time, held-out pass@1.
#
#   MODEL_DIR=models/SmolLM2-135M-Instruct MINUTES=10 SEEDS="1 2" \
#       bash benchmarks/fully_async_smollm2.sh
#
# WORKLOAD=gtn runs gem's GuessTheNumber-v0-easy episodes instead (the recipe of
# examples/envs/sweep-smollm2-guess-the-number.sh: 4 games x 8 plays, up to 4 turns of 32
# tokens, KV reuse across turns, 100 held-out games), GRPO, B with --use-tis:
#
#   WORKLOAD=gtn MINUTES=6 SEEDS="1 2" bash benchmarks/fully_async_smollm2.sh
#
# WORKLOAD=longtail runs the sums with responses of up to 256 tokens (a long tail: most answers
# take 20-60 tokens, some run to the cap), both arms under --fully-async at one thread per
# process: B samples every group to the end, C adds --partial-rollout
# --over-sampling-batch-size 8 (starts 8 groups, trains the first 4 complete, carries the rest):
#
#   WORKLOAD=longtail MINUTES=10 SEEDS=1 bash benchmarks/fully_async_smollm2.sh
#
# Results: docs/performance.md ("Fully asynchronous on SmolLM2", and "... GuessTheNumber").
set -euo pipefail
HERE=${HERE:-$(cd "$(dirname "$0")" && pwd)}
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
MINUTES=${MINUTES:-10}
SEEDS=${SEEDS:-1 2}
ROOT=${ROOT:-runs/fully-async}
export PYTHON MODEL_DIR
mkdir -p "${ROOT}"

WORKLOAD=${WORKLOAD:-sums}
GTN=(--env "${HERE}/../examples/envs/gem_last_number.py:guess_the_number_easy" --max-turns 4
     --apply-chat-template --eval-episodes 100 --eval-temperature 0 --eval-max-response-len 32
     --advantage-estimator grpo --hf-checkpoint "${MODEL_DIR}" --num-rollout 100
     --rollout-batch-size 4 --n-samples-per-prompt 8 --micro-batch-size 16
     --rollout-max-response-len 32 --rollout-temperature 1.0 --lr 2e-5 --eps-clip 0.2
     --clip-grad 1.0 --log-samples 4 --eval-interval 100)  # the budget ends a run first

run_arm() {  # arm seed threads launcher...
  local arm=$1 seed=$2 threads=$3
  shift 3
  start=$(date +%s)
  if [[ "${WORKLOAD}" == gtn ]]; then
    # shellcheck disable=SC2086  # the launcher and ARM_FLAGS are words
    OMP_NUM_THREADS=${threads} $* -m relax train "${GTN[@]}" --seed "${seed}" \
      --exit-duration-in-mins "${MINUTES}" ${ARM_FLAGS:+${ARM_FLAGS} --use-tis} \
      --output-dir "${ROOT}/${arm}-seed${seed}" > "${ROOT}/${arm}-seed${seed}.log" 2>&1
    echo "${arm} seed ${seed}: $(( $(date +%s) - start )) s ($(git rev-parse --short HEAD))" \
      | tee -a "${ROOT}/walltimes.txt"
    return
  fi
  # shellcheck disable=SC2086  # ARM_FLAGS are words
  OMP_NUM_THREADS=${threads} ALGO=grpo SEED="${seed}" NUM_ROLLOUT=1000 TRAIN_SIZE=4000 \
    MAX_RESPONSE_LEN="${MAX_RESPONSE_LEN:-64}" \
    EVAL_INTERVAL=1000 LOG_SAMPLES=0 OUTPUT_DIR="${ROOT}/${arm}-seed${seed}" LAUNCHER="$*" \
    bash "${HERE}/../examples/reasoning_gym/run-smollm2-reasoning-gym.sh" \
    --exit-duration-in-mins "${MINUTES}" --use-tis ${ARM_FLAGS:-} \
    > "${ROOT}/${arm}-seed${seed}.log" 2>&1
  echo "${arm} seed ${seed}: $(( $(date +%s) - start )) s ($(git rev-parse --short HEAD))" \
    | tee -a "${ROOT}/walltimes.txt"
}

TORCHRUN="${PYTHON} -m torch.distributed.run --standalone --nproc_per_node 2"
ASYNC="--fully-async --max-staleness 1"
for seed in ${SEEDS}; do
  if [[ "${WORKLOAD}" == longtail ]]; then
    MAX_RESPONSE_LEN=256 ARM_FLAGS="${ASYNC}" run_arm B "${seed}" 1 "${TORCHRUN}"
    MAX_RESPONSE_LEN=256 ARM_FLAGS="${ASYNC} --partial-rollout --over-sampling-batch-size 8" \
      run_arm C "${seed}" 1 "${TORCHRUN}"
    continue
  fi
  run_arm A "${seed}" 2 "${PYTHON}"
  ARM_FLAGS="${ASYNC}" run_arm B "${seed}" 1 "${TORCHRUN}"
done

"${PYTHON}" - "${ROOT}" ${SEEDS} <<'PY'
import json, os, sys
root, seeds = sys.argv[1], sys.argv[2:]


def median(rows, key):
    values = sorted(r[key] for r in rows if key in r)
    return values[len(values) // 2] if values else float("nan")


print("| arm | seed | steps | training minutes | samples / s | step (s) | generate (s) | "
      "update (s) | response tokens | train idle | rollout idle | held-out |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for arm in ("A", "B", "C"):
    for seed in seeds:
        if not os.path.exists(f"{root}/{arm}-seed{seed}/metrics.jsonl"):
            continue
        with open(f"{root}/{arm}-seed{seed}/metrics.jsonl", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        steps = [r for r in rows if "perf/step_time" in r]
        seconds = sum(r["perf/step_time"] for r in steps)
        later = steps[1:] or steps  # medians over steps 2 on: step 1 also loads and warms up
        generate = "async/rollout_generate_time" if arm != "A" else "perf/rollout_time"
        idle = [sum(r.get(k, float("nan")) for r in later) / len(later)
                for k in ("async/train_idle_fraction", "async/rollout_idle_fraction")]
        heldout = [r[k] for r in rows for k in r
                   if k.startswith("eval/") and k.endswith("pass@1")]
        print(f"| {arm} | {seed} | {len(steps)} | {seconds / 60:.1f} | "
              f"{32 * len(steps) / seconds:.2f} | {median(later, 'perf/step_time'):.1f} | "
              f"{median(later, generate):.1f} | {median(later, 'perf/update_time'):.1f} | "
              f"{median(later, 'rollout/response_length'):.0f} | {idle[0]:.2f} | {idle[1]:.2f} | "
              f"{heldout[-1] if heldout else float('nan'):.3f} |")
PY
