# fencelab: `make demo` and `make test` do all set-up on a fresh machine (idempotent).
VENV := .tools/venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: install test test-slow demo bench bench-server bench-checker bench-recording down clean

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

bench-checker: install
	@cd bench/checker/porcupine && go build -o ../porcupine-bench .
	@$(PY) bench/checker/run.py

bench-recording: install
	@$(PY) bench/recording_overhead.py

bench: bench-server bench-recording bench-checker

down:
	@$(VENV)/bin/fencelab down

clean:
	rm -rf .tools build *.egg-info .pytest_cache
