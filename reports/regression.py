"""The nightly regression rule: one run of a cell against its comparable history.

`parity nightly` judges each new cell against the history with `against_history`, and
`parity publish` (reports.site) judges every past run of a history with `judge`, the rule
both apply, so the dashboard's verdicts are the ones the nightly printed.

The statistics are `reports.stats` (the one rule) and the cell matching and cost diff are
`reports.compare` and `reports.costs`. A run regresses when its timing is slower than the last
`BASELINE_RUNS` comparable runs beyond noise by at least the threshold, or when any cost
metric (compiled FLOPs, bytes accessed, planned peak memory, executions per step, compiles;
a plan's figures) increased against the latest comparable run: those are exact, so no noise
can hide or fake them. Only records with the same cell key (arm, work, run options,
environment) are compared: a run with none before it starts a new baseline.
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


def judge(cell: Cell, same: Sequence[Record], *, threshold: float,
          full_ci: bool = True) -> NightlyRow:
    """One run's records of one cell key (`cell`) against `same`: the ok records of that key
    from earlier runs, in (timestamp, round) order. Only the last `BASELINE_RUNS` run ids of
    `same` are read, so a caller may pass just those. `full_ci=False` computes the timing's
    CI only where the verdict depends on it (reports.compare.compare_cells); the status is
    the same."""
    if not cell.ok:
        return NightlyRow(cell, FAILED)
    if not same:
        return NightlyRow(cell, FIRST)
    recent = list(dict.fromkeys(h.run_id for h in same))[-BASELINE_RUNS:]
    baseline = [h for h in same if h.run_id in recent]
    latest = [h for h in baseline if h.run_id == recent[-1]]
    row = compare_cells(Cell(cell.key, baseline), cell, min_effect=threshold, full_ci=full_ci)
    row = dataclasses.replace(row, cost_changes=costs.changes(latest, cell.ok))
    regressed = row.verdict == stats.SLOWER or bool(costs.increases(row.cost_changes))
    return NightlyRow(cell, REGRESSION if regressed else OK, row, baseline)


def against_history(new: Sequence[Record], history: Sequence[Record], *,
                    threshold: float) -> list[NightlyRow]:
    """Classifies each new cell against the comparable history (other run ids)."""
    run_ids = {r.run_id for r in new}
    past = [h for h in history if h.ok and h.run_id not in run_ids]
    rows = []
    for cell in cells(new):
        same = sorted((h for h in past if h.cell_key() == cell.key),
                      key=lambda h: (h.timestamp or "", h.round))
        rows.append(judge(cell, same, threshold=threshold))
    return rows
