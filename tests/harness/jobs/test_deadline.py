"""harness.jobs.deadline: a run under --time-limit starts no cell it expects to end past
the limit (by earlier records of the same kind of cell), stops there, and says how to
resume; `parity run` exits 3 with nothing half-run."""

import dataclasses
from pathlib import Path

import pytest

from harness.contract import cell_hash
from harness.grid.expand import expand
from harness.jobs.deadline import CUT, Deadline
from harness.orchestrator.loop import Sink, Slot
from harness.store import results
from reports.record import codec
from tests.harness.cli_helpers import parity_cli
from tests.reports.helpers import fixture_records

TINY = {"preset": "tiny", "batch": 4, "steps": 2, "warmup": 1}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _task(cell, round_index=0, parity=False):
    sink = Sink(path=Path("r.jsonl"), run_id="r", store=None, env={})
    return (Slot(dataclasses.replace(cell, parity=parity), round_index, 0, sink),)


def _record(cell, wall_s, parity, backend="cpu"):
    """A real run's record (the report tests' fixture) as one of `cell`, `wall_s` long."""
    (real, *_) = fixture_records()
    return dataclasses.replace(
        real, arm=cell.arm, config_hash=cell_hash(cell.spec), wall_s=wall_s,
        run=dataclasses.replace(real.run, parity=parity),
        environment=dataclasses.replace(real.environment, backend=backend))


def test_a_cell_is_expected_to_take_its_kind_s_longest_record_and_declined_past_the_limit():
    s16, s32 = expand({**TINY, "arms": ["native"], "seq": [16, 32]})
    (engine,) = expand({**TINY, "arms": ["engine"], "seq": [16]})
    clock = Clock()
    deadline = Deadline(100, clock=clock)
    deadline.learn([_record(s16, 30.0, parity=False), _record(s16, 40.0, parity=False),
                    _record(s16, 90.0, parity=True)])
    assert deadline.expected_s(_task(s16)) == 40.0  # the longest of its kind
    assert deadline.expected_s(_task(s16, parity=True)) == 90.0  # a checked round apart
    assert deadline.expected_s(_task(s32)) == 40.0  # another shape: the arm's longest
    assert deadline.expected_s(_task(engine)) is None  # nothing to go by
    clock.now += 55  # 45 s left
    assert deadline.keep(_task(s16)) and deadline.keep(_task(engine))  # 40 s fits; unknown
    assert not deadline.keep(_task(s16, parity=True))  # 90 s does not
    assert not deadline.keep(_task(s16))  # and nothing after it starts: the order holds
    assert len(deadline.declined) == 2 and deadline.cut
    assert deadline.summary() == (
        "parity: --time-limit 100 s: 2 cells not started (the next, native tiny seq=16 "
        "batch=4 ga=1, is expected to take 90 s, 45 s were left); the same command with "
        "--run-id r runs them")
    with pytest.raises(ValueError, match="--time-limit 0: give a positive"):
        Deadline(0)


def test_records_of_another_backend_say_nothing_of_this_one_s_cells(tmp_path):
    (s16,) = expand({**TINY, "arms": ["native"], "seq": [16]})
    for name, backend, wall in (("a.jsonl", "tpu", 500.0), ("b.jsonl", "cpu", 20.0)):
        results.append(tmp_path / name, _record(s16, wall, parity=False, backend=backend))
    deadline = Deadline(100)
    deadline.learn_dir(tmp_path, "cpu")
    assert deadline.expected_s(_task(s16)) == 20.0
    deadline.learn_dir(tmp_path, "tpu")
    assert deadline.expected_s(_task(s16)) == 500.0


def test_a_run_past_its_time_limit_starts_no_cell_and_exits_3(tmp_path):
    """A tiny native cell's record in --out (round 0 of run `cut`, 20 s long) says what
    such a cell takes; the same grid's second round under a 1 s limit is not started: no
    record, exit 3, the resume line."""
    args = ["run", "--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4",
            "--steps", "2", "--warmup", "1", "--no-parity", "--out", str(tmp_path),
            "--run-id", "cut"]
    (cell,) = expand({**TINY, "arms": ["native"], "seq": [16], "parity": False})
    results.append(tmp_path / "cut.jsonl",
                   dataclasses.replace(_record(cell, 20.0, parity=False), run_id="cut", round=0))
    second = parity_cli(*args, "--rounds", "2", "--time-limit", "1")
    assert second.returncode == CUT, second.stderr
    assert "parity: --time-limit 1 s: 1 cells not started (the next, native tiny seq=16 " \
           "batch=4 ga=1 round 1, is expected to take 20 s" in second.stdout
    assert "the same command with --run-id cut runs them" in second.stdout
    assert len(codec.read(tmp_path / "cut.jsonl")) == 1
    # A night of the same grid in that directory (a history) under the limit: not judged.
    night = parity_cli("nightly", *args[1:args.index("--out")], "--history", str(tmp_path),
                       "--run-id", "night", "--time-limit", "1")
    assert night.returncode == CUT, night.stderr
    assert "the same command with --run-id night runs them; the night is judged when it " \
           "is whole (0 cells recorded by this command" in night.stdout
    assert not (tmp_path / "nightly").exists()  # no report of a part of a night
