# Two commands for a fresh machine: `make parity` and `make test`.
# The stack needs Python 3.12 (the real MaxText requires it). PY is the first 3.12 found: on
# PATH (a pyenv shim resolves through .python-version), then under pyenv's root.
IS_312 := import sys; sys.exit(sys.version_info[:2] != (3, 12))
PY ?= $(shell for p in python3.12 "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.12*/bin/python3.12 \
        "$$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do \
        "$$p" -c '$(IS_312)' 2>/dev/null && { echo "$$p"; break; }; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: parity test test-slow lint clean browser

# libtpu (the TPU compiler: XLA's TPU7x plans without a chip) goes outside the import path,
# into $(VENV)/libtpu: importable, it makes JAX look for TPU chips in every process.
# harness.xla.target loads it on request.
$(STAMP): pyproject.toml requirements.lock
	@test -n "$(PY)" || { echo "make: Python 3.12 not found; install it (e.g. 'pyenv install \
	3.12.1') or pass PY=/path/to/python3.12" >&2; exit 1; }
	@$(BIN)/python -c '$(IS_312)' 2>/dev/null || { rm -rf $(VENV) && $(PY) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip
	grep -v '^libtpu==' requirements.lock > $(VENV)/requirements.txt
	$(BIN)/python -m pip install -q -r $(VENV)/requirements.txt
	$(BIN)/python -m pip install -q --no-deps -e '.[test]'
	rm -rf $(VENV)/libtpu
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/libtpu \
		$$(grep '^libtpu==' requirements.lock)
	@touch $(STAMP)

# The selftest (run while the arms' packages import; no cell starts unless it passes), the
# default CPU parity suite (every arm, GA 1/4), then the report. The report is written
# even when a cell failed (it lists failed cells); the exit status is the run's.
parity: $(STAMP)
	rm -rf parity-out
	$(BIN)/parity run --selftest --suite cpu-default --out parity-out/results; status=$$?; \
	ls parity-out/results/*.jsonl >/dev/null 2>&1 || exit $$status; \
	$(BIN)/parity report parity-out/results -o parity-out/parity.md && exit $$status

# Two pytest-xdist workers by default (CI's machine has 2 cores; each worker holds a few GiB,
# so more workers want more memory: TEST_WORKERS=N). A module's tests run on one worker, so a
# module-scoped fixture (a plan of every arm, a pair of runs) is built once.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope

test: $(STAMP) browser
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(PYTEST) -m "not slow" --durations=15

# The site test (tests/reports/site/test_browser.py) opens `parity publish`'s pages in
# headless Chromium: Debian's package, driven by playwright (never `playwright install`: no
# browser download). Installed here when missing and this is root with apt-get; otherwise
# that test skips, saying how to install it.
CHROMIUM := /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } \
	  || echo "make: chromium not installed (apt-get install chromium); the browser test \
	will skip"

# The tests marked slow (multi-process runs, nightly and A/B from git refs, and the
# in-process parity runs that compile every arm at GA 4 or over 8 devices): CI runs them
# after `make test`.
test-slow: $(STAMP)
	$(PYTEST) -m slow --durations=10

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache parity-out
