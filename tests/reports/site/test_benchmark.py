"""A year of tpu7x-nightly (365 nights x 24 cells x 4 rounds of 30 steps, and a plan of each
cell every night) published by the CLI, as a user would: the index must stay under 5 MB
(deterministic, asserted); the publish time is printed for the record, never asserted (the
machine may be shared)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reports.site import synthetic

REPO = Path(__file__).resolve().parents[3]
INDEX_LIMIT = 5_000_000


@pytest.mark.slow
def test_a_year_of_nightlies_publishes_with_an_index_under_5_mb(tmp_path):
    start = time.perf_counter()
    records = synthetic.nightly_history(nights=365)
    history = synthetic.write(records, tmp_path / "history")
    made = time.perf_counter() - start
    size = sum(p.stat().st_size for p in history.iterdir())
    site = tmp_path / "site"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "publish", str(history), "-o",
                           str(site)], env=env, capture_output=True, text=True, timeout=900)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr
    index = (site / "index.html").stat().st_size
    print(f"\none year: {len(records)} records in {len(list(history.iterdir()))} files "
          f"({size / 1e6:.0f} MB, made in {made:.0f} s); parity publish took {elapsed:.1f} s "
          f"wall (load average before: {os.getloadavg()[0]:.2f}); index.html "
          f"{index / 1e6:.3f} MB; site {_size(site) / 1e6:.1f} MB\n{proc.stdout}")
    assert index < INDEX_LIMIT
    assert len(list((site / "cells").iterdir())) == 24
    assert len(list((site / "shapes").iterdir())) == 4
    text = (site / "index.html").read_text()
    assert text.count("<tr data-arm=") == 24


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
