# fencelab: `make demo` and `make test` do all set-up on a fresh machine (idempotent).
VENV := .tools/venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test test-slow demo bench bench-server bench-checker down clean

install:
	@bash scripts/install.sh all

test: install
	@bash scripts/run-tests.sh -m "not slow" $(PYTEST_ARGS)

test-slow: install
	@bash scripts/run-tests.sh -m slow $(PYTEST_ARGS)

demo: install
	@$(VENV)/bin/fencelab demo

bench-server: install
	@$(PY) bench/server_throughput.py

bench: bench-server

down:
	@$(VENV)/bin/fencelab down

clean:
	rm -rf .tools build *.egg-info .pytest_cache
