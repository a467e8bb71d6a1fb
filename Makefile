# Two commands for a fresh machine: `make parity` and `make test`.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: parity test lint clean

$(STAMP): pyproject.toml requirements.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements.lock
	$(BIN)/python -m pip install -q --no-deps -e '.[test]'
	@touch $(STAMP)

# The default CPU parity suite (every arm, 2 shapes x GA 1/4), then the report. The
# report is written even when a cell failed (it lists failed cells); the exit status is
# the run's.
parity: $(STAMP)
	$(BIN)/parity selftest
	rm -rf parity-out
	$(BIN)/parity run --suite cpu-default --out parity-out/results; status=$$?; \
	$(BIN)/parity report parity-out/results -o parity-out/parity.md && exit $$status

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -m "not slow"

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) .pytest_cache parity-out
