"""Regression detection: a nightly's cells against the comparable history.

The rule itself (which history runs a cell is compared with, the timing verdict, the exact
cost diff) is `reports.regression.judge`, shared with `parity publish`; this module picks
each new cell's comparable history out of the whole history directory.
"""

from __future__ import annotations

from collections.abc import Sequence

from reports.compare import cells
from reports.record import Record
from reports.regression import (
    BASELINE_RUNS,
    FAILED,
    FIRST,
    OK,
    REGRESSION,
    NightlyRow,
    judge,
)

__all__ = ["BASELINE_RUNS", "FAILED", "FIRST", "OK", "REGRESSION", "NightlyRow",
           "against_history", "judge"]


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
