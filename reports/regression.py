"""The nightly regression rule: one run of a cell against its comparable history.

`parity nightly` judges each new cell against the history with `against_history`, and
`parity publish` (reports.site) judges every past run of a history with `judge`, the rule
both apply, so the dashboard's verdicts are the ones the nightly printed.

The statistics are `reports.stats` (the one rule) and the cell matching and cost diff are
`reports.compare` and `reports.costs`. A run regresses when its timing is slower than the last
`BASELINE_RUNS` comparable runs beyond noise by at least the threshold (by default the
backend's minimum effect, reports.stats.default_min_effect; a suite's
`regression_threshold` or `--threshold` names another), or when any cost
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
from reports.record import Environment, Record

BASELINE_RUNS = 5
"""History runs (run ids) a nightly cell's timing is compared with."""

REGRESSION, OK, FIRST, FAILED = "regression", "ok", "first run (baseline)", "failed"

COMPILER = "plan compiler libtpu"
"""How a change of the libtpu that made two plans is named: plans of different compilers
are not compared (their cell keys differ), so a compiler upgrade is a new baseline, never a
regression."""


@dataclasses.dataclass
class NightlyRow:
    cell: Cell
    status: str
    """regression, ok, first run (baseline), or failed."""
    comparison: CellComparison | None = None
    history: list[Record] = dataclasses.field(default_factory=list)
    """The comparable history runs' records the timing was compared with, oldest first."""
    new_baseline: list[str] = dataclasses.field(default_factory=list)
    """For a first run whose cell ran before under another key: what changed (a plan
    compiler, a version, an XLA flag), the reason it was not compared."""


def environment_changes(old: Environment | None, new: Environment | None, plan: bool) -> list[str]:
    """What differs between two environments in the fields records (`plan`: plans) are
    compared by."""
    if old is None or new is None:
        return [] if old is new else ["environment recorded on one side only"]
    found = []
    for name in Environment.PLAN_COMPARABLE if plan else Environment.COMPARABLE:
        a, b = getattr(old, name), getattr(new, name)
        if name == "versions":
            found += [f"{pkg} {a.get(pkg) or 'absent'} -> {b.get(pkg) or 'absent'}"
                      for pkg in sorted(set(a) | set(b)) if a.get(pkg) != b.get(pkg)]
        elif a != b:
            found.append(f"{name} {_quoted(a)} -> {_quoted(b)}" if name in (
                "xla_flags", "host_malloc") else f"{name} {a} -> {b}")
    return found


def _quoted(value: str) -> str:
    return f"'{value}'" if value else "(none)"


def key_changes(old: Record, new: Record) -> list[str]:
    """Why two records of one dashboard cell have different keys (are not compared)."""
    found = environment_changes(old.environment, new.environment, plan=is_plan(new))
    if old.config_hash != new.config_hash:
        found.append(f"config {old.config_hash} -> {new.config_hash} (the cell's spec or "
                     "options changed)")
    a, b = old.run, new.run
    if a and b:
        for name in ("steps", "warmup", "pairing", "plan_target", "plan_slices"):
            if getattr(a, name) != getattr(b, name):
                found.append(f"{name} {getattr(a, name)} -> {getattr(b, name)}")
        if a.plan_libtpu != b.plan_libtpu:  # a plan is its compiler's output
            found.append(f"{COMPILER} {a.plan_libtpu} -> {b.plan_libtpu}")
    return found


def is_plan(record: Record) -> bool:
    """A plan record (XLA's plan for a target), not a timed run."""
    return bool(record.run and record.run.plan_target)


def judge(cell: Cell, same: Sequence[Record], *, threshold: float | None,
          full_ci: bool = True) -> NightlyRow:
    """One run's records of one cell key (`cell`) against `same`: the ok records of that key
    from earlier runs, in (timestamp, round) order. Only the last `BASELINE_RUNS` run ids of
    `same` are read, so a caller may pass just those. `full_ci=False` computes the timing's
    CI only where the verdict depends on it (reports.compare.compare_cells); the status is
    the same. `threshold`: the relative slowdown that regresses (None: the backend's minimum
    effect)."""
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
                    threshold: float | None) -> list[NightlyRow]:
    """Classifies each new cell against the comparable history (other run ids)."""
    run_ids = {r.run_id for r in new}
    past = [h for h in history if h.ok and h.run_id not in run_ids]
    rows = []
    for cell in cells(new):
        same = sorted((h for h in past if h.cell_key() == cell.key),
                      key=lambda h: (h.timestamp or "", h.round))
        row = judge(cell, same, threshold=threshold)
        if row.status == FIRST:
            row.new_baseline = _why_new(cell.records[0], past)
        rows.append(row)
    return rows


def _why_new(record: Record, past: Sequence[Record]) -> list[str]:
    """What changed since the latest earlier record of the same arm and work, of the same
    kind (plan or timed), whose key differs from `record`'s ([] where there is none)."""
    earlier = [h for h in past if h.arm == record.arm and h.config_hash == record.config_hash
               and is_plan(h) == is_plan(record)]
    if not earlier:
        return []
    latest = max(earlier, key=lambda h: (h.timestamp or "", h.round))
    return key_changes(latest, record)
