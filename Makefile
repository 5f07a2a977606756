# darkroom — the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast test-db lint typecheck check docs bench-install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# Reinstalls only when pyproject.toml changed, so a second `make install` is instant.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/darkroom up

# The test lanes keep compiled modules between runs, whatever the environment says:
# otherwise every pytest process rewrites the assertions of every test module again (about
# 3 s of CPU each) and every process the tests start compiles darkroom anew.
test test-fast test-db: export PYTHONDONTWRITEBYTECODE :=

# Everything, in two phases: the tests that share the cores well on both of them, then the
# process fleets, the chaos runs and the browser alone (they measure leases against the
# clock and want the cores to themselves).
test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not fleet and not browser" -n 2
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "slow or fleet or browser"

# What a developer runs after each change: no process fleets, no chaos run, no restarts,
# no browser, and the property tests on fewer examples (`make test` runs everything, as CI does).
# Four pytest processes on two cores (many tests wait on a server or a deadline), each
# with its own PostgreSQL and S3 server: every test already has its own database, bucket
# and ports.
test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not fleet and not browser" \
		--hypothesis-profile=fast -n 4

# The tests that talk to PostgreSQL (the fleets aside); .ci/run repeats them against a
# second server. One process: both would share that server's template database.
test-db: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not fleet and not browser" \
		tests/db tests/queue tests/files tests/sweeper tests/worker tests/api

lint: install
	$(BIN)/ruff check darkroom tests bench
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

# README.md's table of settings, made from darkroom/config.py.
docs: install
	$(BIN)/python -m tests.docs_sync --write

bench-install: install
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	# sharp (the engine Immich uses), for bench/engines.py; skipped where npm is missing.
	if command -v npm >/dev/null 2>&1; then cd bench/engines && npm ci --no-audit --no-fund --silent; fi

clean:
	rm -rf $(VENV) .darkroom .pytest_cache .mypy_cache .ruff_cache
