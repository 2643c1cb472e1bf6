#!/usr/bin/env bash
# Issue 28 item 2: generation time per step of gem's GuessTheNumber episodes on
# SmolLM2-135M-Instruct (the recipe of docs/reports/guess-the-number-smollm2.md), A: a
# checkout from before KV reuse (every turn prefills the whole conversation) against B: this
# one (each episode's KV cache kept between turns), same seeds, one relax train per arm, the
# median of steps 2..NUM_ROLLOUT of every perf/* metric (benchmarks/ab_step_time.py).
#
#   git archive c93687d | (mkdir -p /tmp/relax-a && tar -x -C /tmp/relax-a)
#   A=/tmp/relax-a OMP_NUM_THREADS=2 bash benchmarks/kv_reuse_ab.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
A=${A:?A: a directory holding a checkout from before KV reuse}
B=${B:-${HERE}}
REPEATS=${REPEATS:-1}
NUM_ROLLOUT=${NUM_ROLLOUT:-3}
MODEL_DIR=$(cd "${MODEL_DIR:-${HERE}/models/SmolLM2-135M-Instruct}" && pwd)
PYTHON=${PYTHON:-python3}
# absolute paths: each arm runs in its own directory
"${PYTHON}" "${HERE}/benchmarks/ab_step_time.py" --a "${A}" --b "${B}" --repeats "${REPEATS}" -- \
  --advantage-estimator reinforce_plus_plus_baseline --normalize-advantages --kl-coef 0 \
  --use-kl-loss --kl-loss-type k2 --kl-loss-coef 0.01 \
  --env "${HERE}/examples/envs/gem_last_number.py:guess_the_number_easy" --max-turns 4 \
  --apply-chat-template --hf-checkpoint "${MODEL_DIR}" --num-rollout "${NUM_ROLLOUT}" \
  --rollout-batch-size 4 --n-samples-per-prompt 8 --micro-batch-size 16 \
  --rollout-max-response-len 32 --rollout-temperature 1.0 --lr 2e-5 --eps-clip 0.2 \
  --clip-grad 1.0 --seed 1 --log-samples 0
