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

.PHONY: parity test test-slow test-py311 wheelhouse lint clean browser

# The lock is installed by uv (UV, pinned here): ~10 s where pip takes ~85 s on CI's 2
# cores, most of `make test`'s first minute on a fresh clone. uv reads its own settings, not
# pip's: where it cannot install (an index only pip.conf names), pip installs the lock
# instead; INSTALLER=pip asks for pip from the start. Either installs exactly the lock.
# libtpu (the TPU compiler: XLA's TPU7x plans without a chip) goes outside the import path,
# into $(VENV)/libtpu: importable, it makes JAX look for TPU chips in every process.
# harness.xla.target loads it on request.
UV := uv==0.13.10
INSTALLER ?= uv
PIP_LOCK := $(BIN)/python -m pip install -q -r $(VENV)/requirements.txt
UV_LOCK := $(BIN)/python -m pip install -q $(UV) && $(BIN)/uv pip install -q \
	--python $(BIN)/python -r $(VENV)/requirements.txt
$(STAMP): pyproject.toml requirements.lock
	@test -n "$(PY)" || { echo "make: Python 3.12 not found; install it (e.g. 'pyenv install \
	3.12.1') or pass PY=/path/to/python3.12" >&2; exit 1; }
	@$(BIN)/python -c '$(IS_312)' 2>/dev/null || { rm -rf $(VENV) && $(PY) -m venv $(VENV); }
	grep -v '^libtpu==' requirements.lock > $(VENV)/requirements.txt
	$(if $(filter uv,$(INSTALLER)),$(UV_LOCK) || { echo "make: uv could not install the \
	lock; pip installs it" >&2; $(PIP_LOCK); },$(PIP_LOCK))
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

# The oldest supported stack (requirements-py311.lock: Python 3.11, jax 0.10.2, flax 0.12.8,
# orbax 0.12.4, and maxtext 0.2.5, whose metadata asks for Python 3.12 and so is installed
# with --ignore-requires-python), as a TPU v5e VM image brings it: each package installed
# without its dependencies, the project on PYTHONPATH instead of installed, as on such a host
# (docs/install.md). Every module is compiled by Python 3.11; then, within CI's time, the
# tests of what moves with JAX, flax and orbax: the engine's optimizations and checkpoints,
# the attention kernels (Pallas splash, compiled for v5e by the host's libtpu 0.0.42.1, which
# the lock's last line pins and this installs into .venv311/libtpu) and the chunked loss,
# every arm's exact gradient (MaxText's arms too, through arms/models/maxtext_compat.py's
# shims) and Tunix's model and loss, the cell (its phases, its fit check, a failing gradient
# check, the MaxText arms' cells), the trace reader, a worker's end, a held chip, the kernels
# microbenchmark, the wheelhouse and the command line's run path. Left out: tests needing
# TPU7x (libtpu 0.0.42.1 predates it) or the trace viewers, and the slow ones but those also
# marked `py311` (the MaxText arms' cells and tied-head gap, which on 3.12 `make parity`
# shows); `make test` runs the rest, which reads records and files the same way on either
# stack.
IS_311 := import sys; sys.exit(sys.version_info[:2] != (3, 11))
PY311 ?= $(shell for p in python3.11 "$${PYENV_ROOT:-$$HOME/.pyenv}"/versions/3.11*/bin/python3.11 \
        "$$(pyenv root 2>/dev/null)"/versions/3.11*/bin/python3.11; do \
        "$$p" -c '$(IS_311)' 2>/dev/null && { echo "$$p"; break; }; done)
VENV311 := .venv311
STAMP311 := $(VENV311)/.installed
PY311_TESTS := tests/engine/test_optimizations.py tests/engine/test_checkpoint.py \
	tests/engine/model/test_attention.py tests/engine/model/test_head.py tests/arms \
	tests/harness/cell tests/harness/measure/test_trace.py \
	tests/harness/orchestrator/test_spawn.py tests/harness/orchestrator/test_environment.py \
	tests/harness/cli/test_cli.py tests/harness/cli/test_cli_kernels.py \
	tests/harness/system/test_wheelhouse.py
PY311_LEFT_OUT := --ignore=tests/harness/cell/test_plan_arms.py -k "not tpu7x"

$(STAMP311): requirements-py311.lock
	@test -n "$(PY311)" || { echo "make: Python 3.11 not found; install it (e.g. 'pyenv \
	install 3.11.7') or pass PY311=/path/to/python3.11" >&2; exit 1; }
	rm -rf $(VENV311) && $(PY311) -m venv $(VENV311)
	grep -v '^libtpu==' requirements-py311.lock | grep -v '^maxtext==' \
		> $(VENV311)/requirements.txt
	$(VENV311)/bin/python -m pip install -q --no-deps -r $(VENV311)/requirements.txt
	$(VENV311)/bin/python -m pip install -q --no-deps --ignore-requires-python \
		$$(grep '^maxtext==' requirements-py311.lock)
	$(VENV311)/bin/python -m pip install -q --no-deps --target $(VENV311)/libtpu \
		$$(grep '^libtpu==' requirements-py311.lock)
	@touch $(STAMP311)

test-py311: $(STAMP311)
	$(VENV311)/bin/python -m compileall -q engine arms harness reports tests
	PYTHONPATH=$(CURDIR) $(VENV311)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope \
		-p no:cacheprovider -m "not slow or py311" $(PY311_LEFT_OUT) --durations=10 \
		$(PY311_TESTS)

# The wheels an offline host lacks (docs/install.md, "An offline host with its own JAX"):
# the runtime part of requirements-py311.lock less what the host has (HOST_HAS) and what its
# own package index provides (HOST_INDEX), binary wheels for CPython HOST_PYTHON on manylinux
# x86_64, without dependencies (maxtext's metadata asks for Python 3.12, hence
# --ignore-requires-python; the lock's pins are those tested on 3.11), maxtext's without its
# tokenizer assets (--slim); and the list the host installs from its index, each package
# within pyproject.toml's supported range (harness/system/wheelhouse.py).
WHEELHOUSE ?= wheelhouse
HOST_PYTHON ?= 3.11
HOST_HAS ?= jax jaxlib libtpu numpy scipy ml_dtypes opt_einsum
HOST_INDEX ?=
MANYLINUX := 2_28 2_27 2_24 2_17
wheelhouse:
	python3 -m harness.system.wheelhouse --out $(WHEELHOUSE) --host-has "$(HOST_HAS)" \
		--host-index "$(HOST_INDEX)"
	python3 -m pip download -q --no-deps --only-binary=:all: --python-version $(HOST_PYTHON) \
		--implementation cp $(MANYLINUX:%=--platform manylinux_%_x86_64) \
		--platform manylinux2014_x86_64 --ignore-requires-python -d $(WHEELHOUSE) \
		-r $(WHEELHOUSE)/requirements.txt
	python3 -m harness.system.wheelhouse --out $(WHEELHOUSE) --slim
	@du -sh $(WHEELHOUSE)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(VENV311) .pytest_cache parity-out
