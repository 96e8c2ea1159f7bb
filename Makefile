# Phalanx — the two set-up commands are `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: venv test lint typecheck unit demo sim-demo bench clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,train]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest -n 2 --dist loadscope -q

test: lint typecheck unit

demo: $(STAMP)
	$(BIN)/python -m phalanx.local.demo

sim-demo: $(STAMP)
	$(BIN)/python -m phalanx.sim.demo

bench: $(STAMP)
	$(BIN)/python bench/scheduler.py --nodes 10000 --gpus-per-node 8 --pending 100000
	$(BIN)/python bench/replay.py

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .pytest_cache .ruff_cache
