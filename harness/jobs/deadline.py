"""A grid run that ends before a host's time limit: `--time-limit SECONDS` starts no cell it
expects to end after that many seconds from the command's start, so a run cut by a host's
limit (the TPU v5e host's calls end at 10 minutes) stops between cells rather than killing
one half done. The cells it does not start are left for the same command with the same
`--run-id`, which skips the recorded ones.

A cell is expected to take as long as the longest record of the same kind of work on the
same backend in the run's results directory (its --out, a nightly's history: earlier runs
and nights, and this command's records as they end): the same arm and shape, else
the same arm at any shape; each a round that checks parity (round 0: the reference, the
parity step) apart from a round that only times. A cell with no such record is started
(nothing says it will not fit); the host's own limit is then what stops it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from harness.contract import cell_hash
from harness.orchestrator.loop import Task
from reports.record import Record, Spec, cell_name, codec, section

CUT = 3
"""The exit status of a run or night that a deadline stopped before its last cell."""


class Deadline:
    """Declines (`keep`) the first task expected to end past `limit_s` seconds from
    `started` (a `time.monotonic` reading; default now), and every task after it, so the
    cells left are the run's last ones in its order and a resumed run keeps that order."""

    def __init__(self, limit_s: float, *, started: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if not limit_s > 0:
            raise ValueError(f"--time-limit {limit_s}: give a positive number of seconds")
        self.limit_s, self.clock = limit_s, clock
        self.started = clock() if started is None else started
        self.walls: dict[tuple, float] = {}
        """The longest wall seen per (arm, cell hash or None, checks parity)."""
        self.declined: list[Task] = []

    def learn(self, records: Iterable[Record]) -> None:
        """Takes each ok record's wall time as what its kind of cell takes."""
        for r in records:
            if not r.ok or r.wall_s is None or r.arm is None:
                continue  # a cell that failed says little of what one that runs takes
            checked = bool(r.run and r.run.parity)
            for key in ((r.arm, r.config_hash, checked), (r.arm, None, checked)):
                self.walls[key] = max(self.walls.get(key, 0.0), r.wall_s)

    def learning(self, on_record: Callable[[int, Record], None] | None
                 ) -> Callable[[int, Record], None]:
        """`on_record` (a run's callback as each record is appended), learning from each
        record first."""
        def learned(index: int, record: Record) -> None:
            self.learn([record])
            if on_record is not None:
                on_record(index, record)
        return learned

    def learn_dir(self, directory: Path, backend: str | None) -> None:
        """Learns from every record of the results files in `directory` (a run's --out, a
        nightly's history) that ran on `backend`."""
        self.learn(r for path in codec.results_files(directory) for r in codec.read(path)
                   if r.environment is None or backend is None
                   or r.environment.backend == backend)

    def expected_s(self, task: Task) -> float | None:
        """What the task's cells are expected to take together; None where one has no
        record of its kind to go by."""
        total = 0.0
        for slot in task:
            checked = bool(slot.cell.parity)
            found = self.walls.get((slot.cell.arm, cell_hash(slot.cell.spec), checked),
                                   self.walls.get((slot.cell.arm, None, checked)))
            if found is None:
                return None
            total += found
        return total

    def left_s(self) -> float:
        return self.limit_s - (self.clock() - self.started)

    def keep(self, task: Task) -> bool:
        """Whether to start `task`: not once a task has been declined, nor where it is
        expected to end past the limit."""
        if not self.declined:
            expected = self.expected_s(task)
            if expected is None or expected <= self.left_s():
                return True
        self.declined.append(task)
        return False

    @property
    def cut(self) -> bool:
        return bool(self.declined)

    def summary(self) -> str:
        """One line: what was not started, why, and how to resume."""
        first = self.declined[0][0]
        name = cell_name(first.cell.arm, section(Spec, first.cell.spec)) + (
            f" round {first.round}" if first.round else "")
        expected = self.expected_s(self.declined[0])
        return (f"parity: --time-limit {self.limit_s:g} s: {len(self.declined)} cells not "
                f"started (the next, {name}, is expected to take {expected:.0f} s, "
                f"{max(self.left_s(), 0):.0f} s were left); the same command with "
                f"--run-id {first.sink.run_id} runs them")
