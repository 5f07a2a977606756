# darkroom — the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install run test test-fast test-db lint typecheck check bench-install clean

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

test: install
	$(BIN)/python -m pytest -q -p no:cacheprovider

# What a developer runs after each change: no process fleets, no chaos run, no restarts,
# no browser, and the property tests on fewer examples (`make test` runs everything, as CI does).
# Two pytest processes, each with its own PostgreSQL and S3 server: every test already has
# its own database, bucket and ports. (`make test` stays in one process: the fleets and the
# chaos run measure leases against the clock and want the cores to themselves.)
test-fast: install
	$(BIN)/python -m pytest -q -p no:cacheprovider -m "not slow and not fleet and not browser" \
		--hypothesis-profile=fast -n 2

# The tests that talk to PostgreSQL; .ci/run repeats them against a second server.
test-db: install
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/db tests/queue tests/sweeper tests/worker tests/api

lint: install
	$(BIN)/ruff check darkroom tests bench
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

bench-install: install
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'

clean:
	rm -rf $(VENV) .darkroom .pytest_cache .mypy_cache .ruff_cache
