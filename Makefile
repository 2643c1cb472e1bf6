# `make test` and `make demo` set everything up on a fresh machine: a local .venv,
# the pinned CPU torch wheel first (an unpinned torch would pull a multi-GB CUDA
# build), then the project with its train, test and rl extras. The stamp file makes
# re-runs cheap and re-installs when pyproject.toml changes.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.relax-installed
TORCH_PIN := torch==2.13.0
PYTEST_ARGS ?=

.PHONY: install test demo lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[train,test,rl]" "$(TORCH_PIN)"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check relax tests benchmarks

demo: $(STAMP)
	$(PY) -m relax train

bench: $(STAMP)
	$(PY) benchmarks/bench_algorithms.py

clean:
	rm -rf $(VENV) .pytest_cache
