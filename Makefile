# Two commands for a fresh machine: `make demo` (the main job) and `make test` (the test suite).
# Each creates .venv and installs the project with what it needs: the `dev` extra, which pulls
# `demo` and `server` (pyproject.toml; a bare `pip install .` is the client side only).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	# compile the workers' numba kernels once (≈ 15 s) into their on-disk cache
	$(BIN)/python -m aggregator.warm
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/ldp-stream demo $(ARGS)

# kafka-python 3 runs every client of a process on one shared network loop, which carries state
# from test to test; the broker-freeze producer tests get an interpreter of their own.
ISOLATED := tests/integration/test_producer_outage.py

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest --ignore=$(ISOLATED) $(PYTEST_ARGS)
	$(BIN)/python -m pytest $(ISOLATED) $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

# Benchmarks and paper reproductions (docs/benchmarks.md, docs/reproductions.md); BENCH_ARGS=--quick for a smoke run
bench: $(STAMP)
	$(BIN)/pip install --quiet -e '.[bench]'
	$(BIN)/python -m benchmarks.client $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.repro_zil $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.repro_uldp $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.efficiency $(BENCH_ARGS)
	$(BIN)/python -m benchmarks.pipeline $(BENCH_ARGS)

clean:
	rm -rf $(VENV) demo-output .pytest_cache
