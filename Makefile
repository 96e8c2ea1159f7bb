# Phalanx — the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# pip's progress, one line per package, never wrapped mid-argument when piped (pip draws
# with Rich, which assumes 80 columns without a terminal).
PIP    := COLUMNS=200 $(BIN)/pip --disable-pip-version-check --no-input
INSTALL := $(PIP) install --progress-bar off

.PHONY: venv engines vllm-env test-vllm test lint typecheck unit demo sim-demo bench clean

$(VENV)/bin/python:
	@echo "creating $(VENV) …"
	$(PYTHON) -m venv $(VENV)
	@$(INSTALL) --quiet --upgrade pip

# What the demo needs: Phalanx and torch (its job trains a small GPT).
$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "installing Phalanx and torch into $(VENV) (first time: about a minute) …"
	$(INSTALL) -e '.[train]'
	touch $(DEMO_STAMP)

# Everything: the demo's, plus the test and lint tools.
$(STAMP): pyproject.toml $(DEMO_STAMP)
	@echo "installing the test and lint tools into $(VENV) …"
	$(INSTALL) -e '.[dev,train]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# Real inference engines for the serving tests: llama.cpp's llama-server built from PyPI's
# llama-cpp-python sdist and SmolLM2-135M (GGUF), once, into ~/.cache/phalanx/engines
# (about 4 minutes on 2 cores the first time; instant afterwards).
engines: $(STAMP)
	$(BIN)/python -m phalanx.testing.engines build

# vLLM on CPU for the tests marked `vllm`: its own venv (~/.cache/phalanx/engines/vllm-venv,
# 3.5 GB, a few minutes the first time; never Phalanx's venv) and SmolLM2-135M as fp32
# safetensors. Idempotent: instant once built.
vllm-env: $(STAMP) engines
	$(BIN)/python -m phalanx.testing.vllm_env build

# The vLLM tests, which `make test` deselects; says how many ran (and fails if none did).
test-vllm: $(STAMP) vllm-env
	@$(BIN)/pytest -m vllm -q tests/serve --junitxml=$(VENV)/vllm-tests.xml; status=$$?; \
	$(BIN)/python -m phalanx.testing.vllm_env report $(VENV)/vllm-tests.xml; exit $$status

unit: $(STAMP) engines
	$(BIN)/pytest -n 2 --dist loadscope -q --durations=30

test: lint typecheck unit

demo: $(DEMO_STAMP)
	$(BIN)/python -m phalanx.local.demo

sim-demo: $(DEMO_STAMP)
	$(BIN)/python -m phalanx.sim.demo

bench: $(STAMP)
	$(BIN)/python bench/scheduler.py --nodes 10000 --gpus-per-node 8 --pending 100000
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
