"""harness.store.layout: where a run's cells keep their compilation caches."""

from pathlib import Path

from harness.contract import COMPILE_CACHE, REFERENCE_DIR
from harness.store.layout import RunStore


def test_caches_are_the_run_store_s_unless_the_environment_keeps_them(tmp_path, monkeypatch):
    """One compilation cache for every cell of a run; the references kept between runs: in
    the user's cache directory, beside a kept compilation cache, or where
    $PARITY_REFERENCE_DIR says."""
    for name in (COMPILE_CACHE, REFERENCE_DIR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "user"))
    with RunStore.temporary() as store:
        env = store.cell_env()
        assert Path(env[COMPILE_CACHE]) == Path(store.root) / "xla"
        assert Path(env[REFERENCE_DIR]) == tmp_path / "user" / "parity" / "reference"
    kept = tmp_path / "kept"
    monkeypatch.setenv(COMPILE_CACHE, str(kept))
    with RunStore.temporary() as store:
        env = store.cell_env()
        assert Path(env[COMPILE_CACHE]) == kept / "xla"  # outlives the run's store
        assert Path(env[REFERENCE_DIR]) == kept / "reference"
    monkeypatch.setenv(REFERENCE_DIR, str(tmp_path / "elsewhere"))
    with RunStore.temporary() as store:
        assert Path(store.cell_env()[REFERENCE_DIR]) == tmp_path / "elsewhere"
