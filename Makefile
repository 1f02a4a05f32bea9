# fencelab: `make demo` and `make test` do all set-up on a fresh machine (idempotent).
VENV := .tools/venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
EVIDENCE_ARGS ?=
MUTANTS_ARGS ?=

.PHONY: install test test-slow demo evidence mutants third-party bench bench-server bench-checker bench-recording down clean

install:
	@bash scripts/install.sh all

test: install
	@bash scripts/run-tests.sh -m "not slow" --durations=30 $(PYTEST_ARGS)

test-slow: install
	@bash scripts/run-tests.sh -m slow $(PYTEST_ARGS)

demo: install
	@$(VENV)/bin/fencelab demo

evidence: install
	@$(VENV)/bin/fencelab evidence $(EVIDENCE_ARGS)

# every planted bug under the general workloads at their defaults, and the unmodified server on the same runs (docs/mutants.md)
mutants: install
	@$(VENV)/bin/fencelab mutants $(MUTANTS_ARGS)

# third-party lease systems (valkey-lock, valkey-lock-fenced, etcd) x fenced/unfenced x nemeses x seeds
# (docs/third-party.md); resumable: run it again after an interruption
THIRD_PARTY_ARGS ?=
third-party: install
	@$(VENV)/bin/fencelab campaign campaigns/third-party.toml $(THIRD_PARTY_ARGS)

bench-server: install
	@$(PY) bench/server_throughput.py

bench-checker: install
	@cd bench/checker/porcupine && go build -o ../porcupine-bench .
	@$(PY) bench/checker/run.py

bench-recording: install
	@$(PY) bench/recording_overhead.py

# every issue-13 figure beside its target, measured in one run, in one table (docs/performance.md)
BENCH_ARGS ?=
bench: install
	@cd bench/checker/porcupine && go build -o ../porcupine-bench .
	@$(PY) bench/summary.py $(BENCH_ARGS)

down:
	@$(VENV)/bin/fencelab down

clean:
	rm -rf .tools build *.egg-info .pytest_cache
