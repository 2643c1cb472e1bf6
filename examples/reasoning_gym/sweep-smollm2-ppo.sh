#!/usr/bin/env bash
# PPO with a learned critic against GRPO and REINFORCE++ on reasoning-gym sums
# (docs/reports/ppo-smollm2.md): the base model's held-out evaluation, then ARMS x SEEDS of
# run-smollm2-reasoning-gym.sh, one run at a time at one intra-op thread, then the table.
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash examples/reasoning_gym/sweep-smollm2-ppo.sh
#   SEEDS="1" ARMS="ppo" CRITIC_LR=5e-5 bash examples/reasoning_gym/sweep-smollm2-ppo.sh
#
# The ppo arm: --advantage-estimator ppo --normalize-advantages --gamma 1.0 --lambd ${LAMBD:-1.0}
# --value-clip ${VALUE_CLIP:-0.2} --critic-lr ${CRITIC_LR:-1e-4}; everything else is the budget
# of the other arms (20 rollout steps x 4 prompts x 8 samples, one optimizer step per rollout
# step). Every variable of sweep-smollm2-reasoning-gym.sh and run-smollm2-reasoning-gym.sh
# applies. Output: runs/smollm2-rg/<arm>-seed<S>, runs/smollm2-rg/summary.md; the curves:
#
#   relax plot runs/smollm2-rg/{ppo,grpo,reinforce_plus_plus}-seed[12] \
#       --output docs/reports/images/ppo-smollm2.png \
#       --panels reward,response_length,eval,grad_norm --smooth 3
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the machine is shared
export SEEDS=${SEEDS:-1 2}
export ARMS=${ARMS:-ppo grpo reinforce_plus_plus}
exec bash "${HERE}/sweep-smollm2-reasoning-gym.sh"
