"""harness.cell.phases: each ended phase is noted where the parent can read it."""

import pathlib
import time

from harness.cell.phases import Phases
from harness.contract import progress_file


def test_each_phase_is_noted_as_it_ends(tmp_path):
    path = progress_file(str(tmp_path / "record.json"))
    phases = Phases(spawned_at=time.time() - 2.0, progress=path)
    phases.end("imports")
    assert pathlib.Path(path).read_text().splitlines()[0].startswith("start 2.")
    phases.end("build", less={"compile": 0.0})
    lines = [line.split() for line in pathlib.Path(path).read_text().splitlines()]
    assert [name for name, _ in lines] == ["start", "imports", "build"]
    assert [float(s) for _, s in lines] == [round(phases.seconds[n], 1) for n, _ in lines]
