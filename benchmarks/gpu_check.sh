#!/usr/bin/env bash
# The GPU path, checked in one call: about 5-8 minutes on one H200.
#
#   bash benchmarks/gpu_check.sh               # PY=/path/to/python to pick the interpreter
#
# With the device tool's `run` (the machine's own python3 has torch and transformers, no
# network; the checkout travels, and PYTHONPATH below makes `relax` importable without
# installing it):
#
#   run(command="bash benchmarks/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log", timeout_s=540)
#
# Steps, each bounded by `timeout` (together at most BUDGET=470 s, under 8 minutes):
#   (a) tests/algorithms with RELAX_TEST_DEVICE=cuda: every public function of
#       relax.algorithms runs on the GPU against the CPU float64 references
#       (tests/algorithms/conftest.py); the multi-process Gloo tests are left out (CPU only);
#   (b)+(c) benchmarks/gpu_check.py: a Qwen3-0.6B-shaped model with random weights trained 3
#       rollout steps with REINFORCE++ at 64 prompts x 8 samples x 1024 tokens under bf16 with
#       --recompute-granularity full (every decoder layer recomputed in the backward)
#       (step time, phase split, tokens/s, perf/mfu, the decode roofline fraction, peak GPU
#       memory), then Relax's decode against transformers' static-cache generate on the same
#       batch, as a ratio.
# A failing step does not stop the next; the exit status is 0 only when all passed. Without a
# CUDA device it stops at once with a message and exit status 2. Needs python3 with torch and
# transformers; pytest and hypothesis for (a) (the H200 image has them).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

if ! "$PY" - <<'EOF'
import sys
import torch
if not torch.cuda.is_available():
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    sys.exit(f"gpu_check.sh: no CUDA device visible (torch {torch.__version__} is {build}); "
             "this check needs a GPU (the CPU mode of its Python part: "
             "python3 benchmarks/gpu_check.py --size tiny --device cpu)")
import transformers
print(f"gpu_check.sh: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
      f"transformers {transformers.__version__}", flush=True)
EOF
then
    exit 2
fi

BUDGET=${BUDGET:-470}  # seconds for (a)-(c) together: 8 minutes with the check above
failed=()
echo "gpu_check.sh: (a) algorithm tests on cuda"
# no -x: one call should name every test that fails on the device
RELAX_TEST_DEVICE=cuda timeout 150 "$PY" -m pytest -q -p no:cacheprovider tests/algorithms \
    --ignore=tests/algorithms/test_distributed.py || failed+=("(a) algorithm tests, status $?")
echo "gpu_check.sh: (a) took $SECONDS s"

# (b)+(c) get what (a) left; training may use all of it but 120 s, which leave room for the
# model build and the decode comparison
left=$((BUDGET - SECONDS))
echo "gpu_check.sh: (b) training and (c) decode, ${left} s left"
timeout "$left" "$PY" benchmarks/gpu_check.py --size qwen3-0.6b --device cuda \
    --train-timeout $((left - 120)) || failed+=("(b)/(c) gpu_check.py, status $?")
echo "gpu_check.sh: done after $SECONDS s"

if ((${#failed[@]})); then
    printf 'gpu_check.sh: FAILED: %s\n' "${failed[@]}"
    exit 1
fi
echo "gpu_check.sh: all steps passed"
