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
# start-ups; XDIST= runs them in one process.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relax-installed
TORCH_PIN := torch==2.13.0
GEM_PIN := gem-llm==0.1.0
PYTEST_ARGS ?=
XDIST ?= -n logical --maxprocesses 4 --dist loadgroup

.PHONY: install test test-fast demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[train,test,rl,agents]" "$(TORCH_PIN)"
	$(PY) -m pip install --quiet --no-deps "$(GEM_PIN)"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m "not subprocess" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check relax tests benchmarks

demo: $(STAMP)
	$(PY) -m relax train

bench: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py

clean:
	rm -rf $(VENV) .pytest_cache
