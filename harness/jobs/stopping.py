"""Between the rounds of an A/B: after each round of a cell (both sides recorded), the
sequential rule's look at its records (reports.sequential); a cell a look settles runs no
more rounds, so `parity ab` and each step of `parity bisect` end when every cell is settled,
or at the budget (--rounds). The run loop asks `Stopper.keep` before each task
(harness.orchestrator.loop.run_tasks); records already written stay as they are, and a
cell's last look reads all of them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.orchestrator.loop import Task
from reports import sequential, stats
from reports.compare import CellComparison
from reports.record import Record, cell_name

Judge = Callable[[list[Record], list[Record], float], list[CellComparison]]
"""One cell's records of A and of B compared, their CIs at a confidence: the cell's rows
(reports.compare.compare_sets'; [] where none can be compared)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stop:
    """How one cell of an A/B ended."""

    cell: str
    """The cell's name."""
    look: sequential.Look
    """Its last look: the rounds it ran, and why no more."""

    def line(self) -> str:
        """'native tiny seq=16 ...: settled: slower beyond the 5% minimum effect after 2 of
        16 rounds'."""
        return f"{self.cell}: {self.look.reason()}"


@dataclasses.dataclass(kw_only=True)
class _Cell:
    """One cell's records so far, its latest look and the rows that look compared."""

    a: list[Record] = dataclasses.field(default_factory=list)
    b: list[Record] = dataclasses.field(default_factory=list)
    look: sequential.Look | None = None
    rows: list[CellComparison] = dataclasses.field(default_factory=list)

    @property
    def rounds(self) -> int:
        """Rounds both sides have recorded (a failed cell's record counts)."""
        return min(len(self.a), len(self.b))


def judged(rows: list[CellComparison]) -> CellComparison | None:
    """The one row of a cell that compares timings, None where the rows are not one such
    (a side failed, or its records do not match the other's)."""
    timed = [row for row in rows if row.timing is not None]
    return timed[0] if len(rows) == 1 and timed else None


class Stopper:
    """The looks of one A/B's cells, by their index in the grid. `judge` compares a cell's
    records; `budget`: the rounds asked for; `min_rounds`: the fewest a look that stops
    needs (harness.grid.options.first_look); `early=False`: every cell runs its budget
    (--fixed-rounds) and is judged once, at 95%."""

    def __init__(self, judge: Judge, *, budget: int, min_rounds: int, early: bool = True):
        self.judge, self.budget, self.min_rounds, self.early = judge, budget, min_rounds, early
        self._cells: dict[int, _Cell] = {}

    def on_record(self, index: int, record: Record) -> None:
        """Keeps a record of cell `index`; where it completes a round whose look can count
        (from `min_rounds` on, or at the budget), the cell's look. A cell one of whose sides
        has failed in every round it completed runs no more rounds (unless the budget was
        asked for): a failure that repeats would spend the budget on cells that cannot be
        compared, and a side with one good round is compared on its good rounds."""
        cell = self._cells.setdefault(index, _Cell())
        (cell.a if record.ab.side == "A" else cell.b).append(record)
        looked = cell.look.rounds if cell.look else 0
        counts = cell.rounds >= self.budget or (self.early and cell.rounds >= self.min_rounds)
        failed = [side for side, records in (("A", cell.a), ("B", cell.b))
                  if not any(r.ok for r in records[:cell.rounds])]
        if cell.rounds > looked and self.early and failed:
            cell.look = sequential.Look(
                rounds=cell.rounds, budget=self.budget, comparison=None,
                spent=cell.look.spent if cell.look else 0.0, taken=False, settled=None,
                failed=" and ".join(failed))
        elif cell.rounds > looked and counts:
            self._look(cell)

    def keep(self, task: Task) -> bool:
        """Whether `task` (a round of one cell) is to run: not where its cell is settled."""
        cell = self._cells.get(task[0].index)
        return cell is None or cell.look is None or not cell.look.last

    def _look(self, cell: _Cell) -> None:
        """The cell's look after its rounds so far (reports.sequential.look), the rows it
        compared kept beside it."""
        rounds, before = cell.rounds, cell.look.spent if cell.look else 0.0
        a, b = cell.a[:rounds], cell.b[:rounds]
        seen: list[list[CellComparison]] = []

        def compare_at(confidence: float) -> stats.Comparison | None:
            seen.append(self.judge(a, b, confidence))
            row = judged(seen[-1])
            return row.timing if row else None

        cell.look = sequential.look(compare_at, rounds=rounds, budget=self.budget,
                                    spent_before=before, min_rounds=self.min_rounds,
                                    early=self.early)
        cell.rows = seen[-1]

    def stops(self) -> list[Stop]:
        """How each cell that was looked at ended, in the grid's order."""
        return [Stop(cell=cell_name(cell.a[0].arm, cell.a[0].spec), look=cell.look)
                for _, cell in sorted(self._cells.items()) if cell.look is not None]

    def decided(self, rows: list[CellComparison]) -> list[CellComparison]:
        """`rows` (the A/B's rows at 95%) with each cell's row replaced by its last look's
        where that compared timings: its CI at the look's confidence, its verdict the
        look's (the same records: a cell runs no round after its last look)."""
        found = {row.new.key: row for cell in self._cells.values()
                 if (row := judged(cell.rows)) is not None and cell.look is not None
                 and cell.look.last}
        return [found.get(row.new.key, row) if row.new is not None else row for row in rows]
