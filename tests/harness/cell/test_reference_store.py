"""harness.cell.reference_store: exact references kept between cells and runs, keyed by the
work and what computes it, written whole, size-bounded."""

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.cell.reference_store import Entry, ReferenceStore, reference_key, source_digest
from harness.grid.expand import expand
from harness.jobs.run import run_grid
from tests.harness.cli_helpers import cli_env
from tests.harness.orchestrator.test_loop import TINY

SPEC = {"preset": "tiny", "seq": 16, "batch": 4, "ga": 2, "dtype": "bfloat16", "mesh": "",
        "optimizer": "adamw", "learning_rate": 1e-3, "clip": None, "seed": 0}
STACK = {"backend": "cpu", "device_kind": "cpu", "versions": {"jax": "0.11.2"}}


def _entry(scale: float = 1.0, size: int = 1000) -> Entry:
    gradient = {"embedding": np.full((size,), scale, np.float32),
                "layers": {0: {"w": np.arange(6, dtype=np.float32).reshape(2, 3) * scale},
                           1: {"w": np.ones((2, 3), np.float32)}}}
    return Entry(loss=2.5 * scale, gradient=gradient, floor_rel_l2=0.03, computed_s=12.0)


def test_an_entry_reads_back_as_written(tmp_path):
    store = ReferenceStore(tmp_path)
    assert store.read("k") is None
    store.write("k", _entry())
    back = store.read("k")
    assert (back.loss, back.floor_rel_l2, back.computed_s) == (2.5, 0.03, 12.0)
    assert sorted(back.gradient["layers"]) == [0, 1]  # layer indices stay integers
    assert np.array_equal(back.gradient["layers"][0]["w"], _entry().gradient["layers"][0]["w"])
    assert back.gradient["embedding"].dtype == np.float32
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial write


def test_the_key_is_the_work_and_what_computes_it_not_the_arm_s_options():
    key = reference_key(SPEC, "default", STACK)
    for same in ({"mesh": "fsdp=8"}, {"optimizer": "sgd"}, {"learning_rate": 1.0},
                 {"clip": 1.0}, {"attention": "splash"}, {"logits_chunk": 256},
                 {"scan_backward": "unfilled"}):
        assert reference_key({**SPEC, **same}, "default", STACK) == key, same
    for other in ({"seq": 32}, {"dtype": "float32"}, {"seed": 1}, {"ga": 4}):
        assert reference_key({**SPEC, **other}, "default", STACK) != key, other
    assert reference_key(SPEC, "highest", STACK) != key
    assert reference_key(SPEC, "default", {**STACK, "device_kind": "TPU v5 lite"}) != key


def test_an_edit_to_the_code_that_computes_a_reference_is_a_new_key(tmp_path):
    repo = Path(__file__).resolve().parents[3]
    for name in ("engine/model", "arms/workload"):
        shutil.copytree(repo / name, tmp_path / name)
    shutil.copy(repo / "arms/spec.py", tmp_path / "arms/spec.py")
    before = source_digest(tmp_path)
    assert before == source_digest(repo)
    decoder = tmp_path / "engine/model/decoder.py"
    decoder.write_text(decoder.read_text() + "\n# an edit\n")
    assert source_digest(tmp_path) != before


def test_the_least_recently_used_entries_go_past_the_bound(tmp_path):
    one = 4 * 1000 * 1.05  # an entry's bytes, about: its float32 embedding dominates
    store = ReferenceStore(tmp_path, bound=int(2.5 * one))
    for i, key in enumerate(("a", "b")):
        store.write(key, _entry(scale=i + 1))
        os.utime(tmp_path / key / "meta.json", (1000 + i, 1000 + i))
    store.read("a")  # used: now the most recent
    store.write("c", _entry(scale=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "c"]  # "b" was least recent
    assert store.read("c").loss == 7.5


@pytest.mark.slow  # two runs of checked cell processes (~14 s)
def test_a_later_run_reads_the_reference_an_earlier_run_computed(tmp_path, monkeypatch):
    monkeypatch.setenv("PARITY_REFERENCE_DIR", str(tmp_path / "kept"))
    cells = expand({**TINY, "arms": ["native"]})
    _, (first,) = run_grid(cells, tmp_path / "one", env=cli_env(), timeout_s=300)
    _, (later,) = run_grid(cells, tmp_path / "two", env=cli_env(), timeout_s=300)
    assert not first.parity.reference_shared and later.parity.reference_shared
    assert later.parity.reference_computed_s == first.parity.reference_computed_s > 0
    assert later.parity.rel_l2 == first.parity.rel_l2 <= 1e-5
    # computed by programs of its own the first time; read back, nothing compiled, later
    assert [e for e in first.timing.compile_log if e["phase"] == "reference"]
    assert not [e for e in later.timing.compile_log if e["phase"] == "reference"]
