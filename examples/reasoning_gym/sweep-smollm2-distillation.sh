#!/usr/bin/env bash
# On-policy distillation on reasoning-gym sums (docs/reports/distillation-smollm2.md): the
# teacher is SmolLM2-135M-Instruct after 20 GRPO steps (run-smollm2-reasoning-gym.sh, grpo,
# seed TEACHER_SEED, saved with --save), the student the base model, trained by distillation
# alone (ALGO=opd_only: --use-opd --opd-only --opd-kl-coef ${OPD_KL_COEF:-1.0}, no task
# reward) on the same budget, against GRPO from the base model. One run at a time, one
# intra-op thread each, then the table.
#
#   MODEL_DIR=$(python scripts/fetch_smollm2.py) bash examples/reasoning_gym/sweep-smollm2-distillation.sh
#   SEEDS="1" OPD_KL_COEF=0.5 bash examples/reasoning_gym/sweep-smollm2-distillation.sh
#
# Steps (a finished run is not redone):
#   1. the teacher: grpo seed TEACHER_SEED with SAVE_DIR=runs/smollm2-rg/grpo-seed1-save; the
#      --save directory itself holds the final model as a Hugging Face directory, which
#      --opd-teacher-load reads as it is;
#   2. the students: opd_only x SEEDS with TEACHER_DIR=that directory;
#   3. GRPO from the base model x SEEDS, the comparator on the same budget.
# Every variable of sweep-smollm2-reasoning-gym.sh and run-smollm2-reasoning-gym.sh applies.
# The curves:
#
#   relax plot runs/smollm2-rg/{grpo,opd_only}-seed[12] \
#       --output docs/reports/images/distillation-smollm2.png --smooth 3
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=${ROOT:-runs/smollm2-rg}
TEACHER_SEED=${TEACHER_SEED:-1}
SEEDS=${SEEDS:-1 2}
NUM_ROLLOUT=${NUM_ROLLOUT:-20}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread per run: the machine is shared
export ROOT NUM_ROLLOUT
TEACHER_DIR=${TEACHER_DIR:-${ROOT}/grpo-seed${TEACHER_SEED}-save}

if [[ ! -f "${TEACHER_DIR}/config.json" ]]; then
  rm -rf "${TEACHER_DIR}" "${ROOT}/grpo-seed${TEACHER_SEED}"  # an unfinished teacher run
  ARMS=grpo SEEDS=${TEACHER_SEED} SAVE_DIR=${TEACHER_DIR} bash "${HERE}/sweep-smollm2-reasoning-gym.sh"
fi
ARMS=opd_only SEEDS=${SEEDS} TEACHER_DIR=${TEACHER_DIR} bash "${HERE}/sweep-smollm2-reasoning-gym.sh"
ARMS=grpo SEEDS=${SEEDS} bash "${HERE}/sweep-smollm2-reasoning-gym.sh"
