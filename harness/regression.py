"""Regression detection: a nightly's cells against the comparable history.

The statistics are `reports.stats` (the one rule) and the cell matching and cost diff are
`reports.compare`. A cell regresses when its timing is slower than the last `BASELINE_RUNS`
comparable history runs beyond noise by at least the threshold, or when any cost metric
(compiled FLOPs, bytes accessed, planned peak memory, executions per step, compiles)
increased against the latest comparable run: those are exact, so no noise can hide or fake
them. Only records with the same cell key (arm, work, run options, environment) are compared.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from reports import costs, stats
from reports.compare import Cell, CellComparison, cells, compare_cells
from reports.record import Record

BASELINE_RUNS = 5
"""History runs (run ids) a nightly cell's timing is compared with."""

REGRESSION, OK, FIRST, FAILED = "regression", "ok", "first run (baseline)", "failed"


@dataclasses.dataclass
class NightlyRow:
    cell: Cell
    status: str
    """regression, ok, first run (baseline), or failed."""
    comparison: CellComparison | None = None
    history: list[Record] = dataclasses.field(default_factory=list)
    """The comparable history runs' records the timing was compared with, oldest first."""


def against_history(new: Sequence[Record], history: Sequence[Record], *,
                    threshold: float) -> list[NightlyRow]:
    """Classifies each new cell against the comparable history (other run ids)."""
    run_ids = {r.run_id for r in new}
    past = [h for h in history if h.ok and h.run_id not in run_ids]
    rows = []
    for cell in cells(new):
        if not cell.ok:
            rows.append(NightlyRow(cell, FAILED))
            continue
        same = sorted((h for h in past if h.cell_key() == cell.key),
                      key=lambda h: (h.timestamp or "", h.round))
        if not same:
            rows.append(NightlyRow(cell, FIRST))
            continue
        recent = list(dict.fromkeys(h.run_id for h in same))[-BASELINE_RUNS:]
        baseline = [h for h in same if h.run_id in recent]
        latest = [h for h in same if h.run_id == recent[-1]]
        row = compare_cells(Cell(cell.key, baseline), cell, min_effect=threshold)
        row = dataclasses.replace(row, cost_changes=costs.changes(latest, cell.ok))
        regressed = (row.verdict == stats.SLOWER
                     or bool(costs.increases(row.cost_changes)))
        rows.append(NightlyRow(cell, REGRESSION if regressed else OK, row, baseline))
    return rows
