"""Test session setup: 8 emulated CPU devices, set before jax is imported anywhere."""

import os

# Tests assert behaviour and HLO-level costs, never speed: LLVM's optimizations are skipped
# (about a quarter of a cold run). XLA's own passes still run, so the optimized HLO, its
# cost analysis and buffer assignment are those of a default build; only machine code and
# float results in the last bit may differ. `parity` runs outside the tests never see it.
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8"
                           + " --xla_backend_optimization_level=0").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# `make test` runs two pytest-xdist workers, and tests of both plan with libtpu (compile-only
# TPU devices: no chip to share), so libtpu's one-process lock is off for the tests' processes;
# the test of that lock's refusal turns it back on for its own `parity plan`.
os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
# The tests run the commands from this checkout, which has uncommitted changes while it is
# being worked on; a command refuses that unless told (harness.jobs.grid.check_code, whose
# own tests clear this).
os.environ.setdefault("PARITY_ALLOW_DIRTY", "1")

import pathlib
import tempfile

import jax
import pytest

# Exact references are kept between runs (harness.cell.reference_store), by default in the
# user's cache directory: the tests keep theirs apart, one store a test (`_reference_store`)
# and this one for what a module-scoped fixture runs before any test's own.
os.environ["PARITY_REFERENCE_DIR"] = tempfile.mkdtemp(prefix="parity-test-reference-")

# Tests compile the same tiny programs many times (every engine test builds a fresh engine);
# XLA's persistent cache serves the repeats. The harness's cells never see this one: each
# arm of a run gets a cache of its own, shared only by that arm's cells
# (harness.store.layout.RunStore).
# Each pytest-xdist worker keeps a cache of its own, unbounded: JAX evicts (and locks) only
# where a cache has a size limit, and then every write first reads the size and access time
# of every entry in the directory. A test that runs a model eagerly writes one entry per
# operation, so a limit made that test's writes quadratic in the cache's size (a 10 s test
# took 100 s beside a 3,700-entry cache). Without a limit there is no lock either, so two
# processes must not share one directory: a worker could read an entry the other is still
# writing.
_cache = (pathlib.Path(__file__).parent.parent / ".pytest_cache" / "jax"
          / os.environ.get("PYTEST_XDIST_WORKER", "main"))
jax.config.update("jax_compilation_cache_dir", str(_cache))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def devices():
    found = jax.devices()
    assert len(found) == 8, f"expected 8 emulated devices, got {len(found)}: XLA_FLAGS was ignored"
    return found


@pytest.fixture(autouse=True)
def _reference_store(tmp_path_factory, monkeypatch):
    """Each test's cells keep their exact references in a store of their own: whether a
    reference was computed or read back is then the test's own doing."""
    monkeypatch.setenv("PARITY_REFERENCE_DIR", str(tmp_path_factory.mktemp("reference")))
