#!/usr/bin/env bash
# The GuessTheNumber report (docs/reports/guess-the-number-smollm2.md): SmolLM2-135M-Instruct trained on
# gem's GuessTheNumber-v0-easy episodes (up to 4 turns, the reply's last number as the move:
# examples/envs/gem_last_number.py) with REINFORCE++-baseline and GRPO, 2 seeds each, one
# wall-clock budget per run (--exit-duration-in-mins); greedy win rate and turns on 100
# held-out games (environment seeds 1000000000..1000000099) before (relax eval) and after.
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash examples/envs/sweep-smollm2-guess-the-number.sh
#
# Output: runs/smollm2-gtn/<arm>-seed<S> (metrics.jsonl, samples.jsonl with whole episodes),
# runs/smollm2-gtn/base/eval_metrics.json, walltimes.txt and summary.md.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-runs/smollm2-gtn}
SEEDS=${SEEDS:-1 2}
ARMS=${ARMS:-reinforce_plus_plus_baseline grpo}
MINUTES=${MINUTES:-15}
NUM_ROLLOUT=${NUM_ROLLOUT:-100}  # the budget ends the run first
MODEL_DIR=${MODEL_DIR:-models/SmolLM2-135M-Instruct}
ENV_SPEC=${ENV_SPEC:-${HERE}/gem_last_number.py:guess_the_number_easy}
EPISODES=${EPISODES:-100}
TURN_TOKENS=${TURN_TOKENS:-32}
PYTHON=${PYTHON:-python3}
COMMON=(--env "${ENV_SPEC}" --max-turns 4 --apply-chat-template
        --eval-episodes "${EPISODES}" --eval-temperature 0 --eval-max-response-len "${TURN_TOKENS}")
mkdir -p "${ROOT}"

if [[ ! -f "${ROOT}/base/eval_metrics.json" ]]; then
  "${PYTHON}" -m relax eval "${MODEL_DIR}" "${COMMON[@]}" --output-dir "${ROOT}/base" > /dev/null
fi
for seed in ${SEEDS}; do
  for arm in ${ARMS}; do
    out="${ROOT}/${arm}-seed${seed}"
    if [[ -f "${out}/metrics.jsonl" ]] && grep -q '"eval/env/pass@1"' "${out}/metrics.jsonl"; then
      continue
    fi
    case "${arm}" in
      reinforce_plus_plus_baseline)
        algo=(--advantage-estimator reinforce_plus_plus_baseline --normalize-advantages
              --kl-coef 0 --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01) ;;
      grpo) algo=(--advantage-estimator grpo) ;;
      *) echo "ARMS: unknown arm ${arm}" >&2; exit 2 ;;
    esac
    rm -rf "${out}"
    start=$(date +%s)
    "${PYTHON}" -m relax train "${algo[@]}" "${COMMON[@]}" --hf-checkpoint "${MODEL_DIR}" \
      --num-rollout "${NUM_ROLLOUT}" --rollout-batch-size 4 --n-samples-per-prompt 8 \
      --micro-batch-size 16 --rollout-max-response-len "${TURN_TOKENS}" \
      --rollout-temperature 1.0 --lr 2e-5 --eps-clip 0.2 --clip-grad 1.0 --seed "${seed}" \
      --log-samples 4 --eval-interval "${NUM_ROLLOUT}" --exit-duration-in-mins "${MINUTES}" \
      --output-dir "${out}" > "${out}.log" 2>&1
    echo "${arm} seed ${seed}: $(( $(date +%s) - start )) s" | tee -a "${ROOT}/walltimes.txt"
  done
done
"${PYTHON}" "${HERE}/../reasoning_gym/summarize.py" "${ROOT}" --set env | tee "${ROOT}/summary.md"
