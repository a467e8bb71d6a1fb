"""harness.store.layout: where a run's cells keep their compilation caches."""

from pathlib import Path

from harness.contract import COMPILE_CACHE, REFERENCE_DIR
from harness.store.layout import RunStore


def test_compile_cache_is_the_run_store_s_unless_the_environment_keeps_one(tmp_path,
                                                                           monkeypatch):
    monkeypatch.delenv(COMPILE_CACHE, raising=False)
    with RunStore.temporary() as store:
        env = store.cell_env(["engine", "native"])  # their names made path-safe
        assert Path(env[COMPILE_CACHE]) == Path(store.root) / "compile" / "engine_native"
        assert Path(env[REFERENCE_DIR]) == Path(store.root) / "reference"
    kept = tmp_path / "kept"
    monkeypatch.setenv(COMPILE_CACHE, str(kept))
    with RunStore.temporary() as store:
        env = store.cell_env(["engine"])
        assert Path(env[COMPILE_CACHE]) == kept / "engine"  # outlives the run's store
        assert Path(env[REFERENCE_DIR]) == Path(store.root) / "reference"
