# The two commands of the contract: `make run` and `make test`. Both install what they need.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test bench chaos system-deps clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Calve needs Python 3.11 or newer ($(PYTHON))"; exit 1; }
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

system-deps:
	@command -v java >/dev/null 2>&1 || { echo "Calve needs Java 17 for Spark: install it (Debian: apt-get install openjdk-17-jre-headless) and retry."; exit 1; }
	@command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server..."; $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

run: $(STAMP) system-deps
	$(VENV)/bin/calve up

test: $(STAMP) system-deps
	$(VENV)/bin/pytest -q

bench: $(STAMP) system-deps
	$(PY) -m tests.bench.ingest_bench

# The fault suite on its own Redis and Spark Connect; `make test` runs it too (pytest -m chaos).
chaos: $(STAMP) system-deps
	$(PY) -m tests.chaos

clean:
	rm -rf data .pytest_cache
