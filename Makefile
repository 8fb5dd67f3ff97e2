# The two commands of the contract: `make run` and `make test`. Both install what they need.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test test-long lint test-deps bench bench-api bench-upsert bench-feed bench-files soak chaos system-deps clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "Calve needs Python 3.11 or newer ($(PYTHON))"; exit 1; }
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

system-deps:
	@command -v java >/dev/null 2>&1 || { echo "Calve needs Java 17 for Spark: install it (Debian: apt-get install openjdk-17-jre-headless) and retry."; exit 1; }
	@command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server..."; $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq redis-server >/dev/null; }

# The test suite's own system packages: a real Prometheus for the dashboard and alert tests, and
# Chromium for the console's browser tests (Playwright drives it; its own browser download fails here).
test-deps: system-deps
	@command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 && [ -x /usr/bin/chromium ] || { echo "installing prometheus and chromium (for the tests)..."; $(SUDO) apt-get update -qq && $(SUDO) apt-get install -y -qq --no-install-recommends prometheus chromium >/dev/null; }

run: $(STAMP) system-deps
	$(VENV)/bin/calve up

# Two pytest workers (each with its own redis-server and Spark Connect server); a test file runs
# whole on one of them, and the longest files start first (tests/conftest.py LONGEST_FIRST). A
# third worker was tried: 13:37 and 16:13 against 14:57 with two, with the fault suite's scenarios
# up to 3x slower under the contention (writer_killed_mid_job 94 s against 27).
# Calve's own modules are compiled first: where PYTHONDONTWRITEBYTECODE is set, each of the few
# hundred role processes the tests start would compile them again.
# make test is everything but the fault suite (chaos) and the deployments beyond the embedded
# default (long: the Spark standalone cluster, Redis Cluster and Sentinel, SeaweedFS's S3 and REST
# catalog, PostgreSQL's catalog, copy-on-write's row changes where merge-on-read's are tested
# alike) and schemathesis (fuzz), and it draws a sixth of the differential tests' examples; make
# test-long runs those, with every example (CI: .ci/run runs both), each half of the fault suite
# (test_chaos.py, test_chaos_tenants.py) on one worker.
PYTEST := $(VENV)/bin/pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: lint test-deps
	$(PY) -m compileall -q service spark_jobs tests
	$(PYTEST) -m "not chaos and not long and not fuzz"

test-long: $(STAMP) test-deps
	$(PY) -m compileall -q service spark_jobs tests
	CALVE_TEST_EXAMPLES=all $(PYTEST) -m "chaos or long or differential or fuzz"

# ruff and deptry, configured in pyproject.toml: seconds, so make test runs them first.
lint: $(STAMP)
	$(VENV)/bin/ruff check service spark_jobs tests alembic
	$(VENV)/bin/deptry .

# CALVE_SPARK_WORKERS=2 make bench: the same on a 2-worker Spark standalone cluster.
bench: $(STAMP) system-deps
	$(PY) -m tests.bench.ingest_bench

# The api alone (Redis, no writer or Spark): its CPU per request, shape by shape (BENCH_SHAPES).
bench-api: $(STAMP) system-deps
	$(PY) -m tests.bench.api_bench

# Row changes against a 1,000,000-row table partitioned by day (BENCH_ROWS, BENCH_SECONDS).
bench-upsert: $(STAMP) system-deps
	$(PY) -m tests.bench.upsert_bench

# The change feed of a 1% update of a 1,000,000-row table (BENCH_ROWS, BENCH_FILES, BENCH_CHANGED).
bench-feed: $(STAMP) system-deps
	$(PY) -m tests.bench.feed_bench

# Parquet files written elsewhere, registered by notification and by list (BENCH_FILES, BENCH_PRODUCERS).
bench-files: $(STAMP) system-deps
	$(PY) -m tests.bench.files_bench

# Thousands of commits under wait=true load with upkeep on; SOAK_COMMITS (3600) sets how many.
soak: $(STAMP) system-deps
	$(PY) -m tests.bench.soak

# The fault suite on its own Redis and Spark Connect, comparing latencies; `make test-long` runs it too (pytest -m chaos).
chaos: $(STAMP) system-deps
	CALVE_CHAOS_COMPARE_LATENCY=1 $(PY) -m tests.chaos

clean:
	rm -rf data .pytest_cache
