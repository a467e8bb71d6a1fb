"""Two sets of records, cell by cell: the timing verdict and the exact cost-metric diff.

`parity compare OLD NEW`, `parity ab` and `parity nightly` all compare this way. A cell is the
records sharing `Record.cell_key()` (arm, work, run options, comparable environment): its
runs are the processes that measured it (interleaved rounds, or separate runs). Timings go
through the one statistics rule (`reports.stats`); cost metrics are compared exactly
(`reports.costs`).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Sequence

from reports import costs, noise, stats
from reports.record import Record, cell_name, sliced_runs


@dataclasses.dataclass(frozen=True)
class Cell:
    """The records of one cell key, in (run, round) order."""

    key: tuple
    records: list[Record]

    @property
    def name(self) -> str:
        return cell_name(self.records[0].arm, self.records[0].spec)

    @property
    def ok(self) -> list[Record]:
        return [r for r in self.records if r.ok]

    @property
    def runs(self) -> list[list[float]]:
        """Per-step times of every run that finished."""
        return [r.timing.step_ms for r in self.ok if r.timing]

    @property
    def slices(self) -> list[list[list[float]]] | None:
        """Per-step times of every finished run cut into its slices (runs x slices x
        steps); None unless every run was timed in slices."""
        return sliced_runs([r for r in self.ok if r.timing])

    @property
    def median_ms(self) -> float | None:
        pooled = [x for run in self.runs for x in run]
        return statistics.median(pooled) if pooled else None


def cells(records: Sequence[Record], *, versions: bool = True,
          options: bool = True) -> list[Cell]:
    """Records grouped by cell key (`versions=False`: its package versions left out;
    `options=False`: our decoder's options left out), in order of first appearance."""
    groups: dict[tuple, list[Record]] = {}
    for record in records:
        groups.setdefault(record.cell_key(versions=versions, options=options), []).append(record)
    return [Cell(key, sorted(group, key=lambda r: (r.run_id or "", r.round)))
            for key, group in groups.items()]


FAILED, FIXED, ONLY_OLD, ONLY_NEW, PLANNED = ("failed", "fixed (failed in old)",
                                             "only in old", "only in new", "plan (exact)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellComparison:
    """One cell of OLD against the same cell of NEW."""

    name: str
    old: Cell | None
    new: Cell | None
    timing: stats.Comparison | None
    verdict: str
    """stats.verdict of the timings, or failed (no run of NEW ran), fixed (OLD had no run,
    NEW has: not a regression), only in old / only in new, or plan (exact): plans of both,
    compared by their figures alone."""
    cost_changes: list[costs.CostChange]
    warnings: list[str]

    @property
    def label(self) -> str:
        """The verdict as printed (stats.label of the timings; `mde=False`: the tables show
        the MDE in a column of its own)."""
        return stats.label(self.timing, mde=False) if self.timing else self.verdict

    def to_json(self) -> dict:
        return {
            "cell": self.name, "verdict": self.verdict, "label": self.label,
            "old_median_ms": self.old and self.old.median_ms,
            "new_median_ms": self.new and self.new.median_ms,
            "old_runs": len(self.old.ok) if self.old else 0,
            "new_runs": len(self.new.ok) if self.new else 0,
            "timing": self.timing.to_json() if self.timing else None,
            "cost_changes": [c.to_json() for c in self.cost_changes],
            "warnings": self.warnings,
        }


def compare_cells(old: Cell, new: Cell, *, paired: bool = False,
                  min_effect: float | None = None, full_ci: bool = True,
                  confidence: float = stats.CONFIDENCE) -> CellComparison:
    """`new` against `old`, judged at `min_effect` (None: the backend's,
    stats.default_min_effect), the timing's CI at `confidence` (a sequential A/B's look:
    reports.sequential). `full_ci=False`: the timing's CI is computed only where it can
    make the timing slower or faster (`stats.compare`'s `full_ci`)."""
    warnings = [f"{side}: {w}" for side, cell in (("old", old), ("new", new))
                for w in ([*(noise.warnings(cell.runs) if cell.runs else []),
                           *noise.machine_warnings(
                               [r.timing.probe_ms for r in cell.ok
                                if r.timing and r.timing.probe_ms],
                               [r.timing.steal for r in cell.ok if r.timing],
                               [r.timing.other_load for r in cell.ok if r.timing]),
                           *costs.nondeterministic(cell.ok)] if cell.ok else [])]
    failed = _counted(f"{side}: {r.error.reason}: {r.error.message}"
                      for side, cell in (("old", old), ("new", new))
                      for r in cell.records if not r.ok)
    if not old.ok or not new.ok:
        return CellComparison(name=new.name, old=old, new=new, timing=None,
                              verdict=FIXED if new.ok else FAILED,
                              cost_changes=[], warnings=failed + warnings)
    if not old.runs or not new.runs:  # plans: no timing, every figure exact
        return CellComparison(name=new.name, old=old, new=new, timing=None, verdict=PLANNED,
                              cost_changes=costs.changes(old.ok, new.ok),
                              warnings=failed + warnings)
    pair = paired and len(old.runs) == len(new.runs)
    rule = {"busy": stats.busy([r.timing.other_load for r in (*old.ok, *new.ok) if r.timing]),
            "backend": stats.one_backend(r.environment.backend if r.environment else None
                                         for r in (*old.ok, *new.ok)),
            "min_effect": min_effect, "confidence": confidence}
    sliced = old.slices, new.slices
    if pair and sliced[0] and sliced[1] and _shape(sliced[0]) == _shape(sliced[1]):
        # Lockstep A/B: slice i of both sides' run r ran next to each other.
        timing = stats.compare_slices(*sliced, **rule)
    else:
        timing = stats.compare(old.runs, new.runs, paired=pair, full_ci=full_ci, **rule)
    return CellComparison(name=new.name, old=old, new=new, timing=timing,
                          verdict=stats.verdict(timing),
                          cost_changes=costs.changes(old.ok, new.ok),
                          warnings=failed + warnings)


def _shape(runs: list[list[list[float]]]) -> list[list[int]]:
    return [[len(s) for s in run] for run in runs]


def _counted(lines) -> list[str]:
    """Each distinct line once, in first-seen order, with ' (x N)' where it repeats."""
    counts = collections.Counter(lines)
    return [line + (f" (x {n})" if n > 1 else "") for line, n in counts.items()]


def compare_sets(old: Sequence[Record], new: Sequence[Record], *, paired: bool = False,
                 min_effect: float | None = None, across_stacks: bool = False,
                 across_options: bool = False,
                 confidence: float = stats.CONFIDENCE) -> list[CellComparison]:
    """Every cell of either set: compared where both have it, else listed as only in one;
    timings judged at `min_effect` (None: each cell's backend's), their CIs at
    `confidence`.

    Cells match on `Record.cell_key()`, so records of other versions, backends, devices or
    XLA flags are never compared (they show as only in one set), except that
    `across_stacks` leaves the package versions out: an A/B whose sides are two software
    stacks compares exactly those; and `across_options` our decoder's options (attention,
    its blocks, the logits chunk): an A/B of those options.
    """
    keys = {"versions": not across_stacks, "options": not across_options}
    old_cells = {c.key: c for c in cells(old, **keys)}
    rows = []
    for cell in cells(new, **keys):
        match = old_cells.pop(cell.key, None)
        if match is None:
            rows.append(CellComparison(name=cell.name, old=None, new=cell, timing=None,
                                       verdict=ONLY_NEW, cost_changes=[], warnings=[]))
        else:
            rows.append(compare_cells(match, cell, paired=paired, min_effect=min_effect,
                                      confidence=confidence))
    rows += [CellComparison(name=c.name, old=c, new=None, timing=None, verdict=ONLY_OLD,
                            cost_changes=[], warnings=[]) for c in old_cells.values()]
    if rows and all(row.old is None or row.new is None for row in rows):
        only_old = sum(row.new is None for row in rows)
        raise ValueError(
            f"the two result sets have no cell in common ({only_old} only in old, "
            f"{len(rows) - only_old} only in new): cells match on arm, config (shape, dtype, "
            "mesh, ...), steps and warmup, versions, backend, devices and XLA flags; compare "
            "runs of the same cells")
    return rows


def regressions(rows: Sequence[CellComparison], *,
                cost_threshold: float = 0.0) -> list[str]:
    """Why `--fail-on-regression` fails: timing regressions beyond noise, cost increases
    beyond `cost_threshold` (relative) and failed cells."""
    found = []
    for row in rows:
        if row.verdict == stats.SLOWER:
            found.append(f"{row.name}: slower, {row.timing.ratio:.3f}x "
                         f"[{row.timing.low:.3f}, {row.timing.high:.3f}]")
        elif row.verdict == FAILED:
            found.append(f"{row.name}: failed")
        found += [f"{row.name}: cost {c.text()}"
                  for c in costs.increases(row.cost_changes, cost_threshold)]
    return found


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def rule_text(rows: Sequence[CellComparison], *, new_label: str = "new",
              old_label: str = "old") -> str:
    """The rule printed above a table of `rows`: the ratio, what each label means, and the
    minimum effect and process spread actually used for these rows' runs (stats.rule), and
    where a row's CI is at another confidence (a sequential A/B's look), that it says so."""
    used = stats.rule([row.timing for row in rows if row.timing])
    looked = any(row.timing.confidence != stats.CONFIDENCE for row in rows if row.timing)
    return (f"Ratio = median {new_label} / median {old_label} (above 1.00: {new_label} is "
            "slower), 95% CI from a bootstrap over runs then steps"
            + (" (a CI at another confidence says so: the look of a sequential A/B that "
               "decided the row, its confidence raised for its share of the 5%)"
               if looked else "") + ", "
            f"{stats.MIN_STEPS}+ steps a run. {stats.LEGEND}"
            + (f" Used for these runs: {used}." if used else "")
            + " Cost metrics are compared exactly.")


def markdown(rows: Sequence[CellComparison], *, old_label: str = "old",
             new_label: str = "new") -> str:
    """The comparison table, then every cost change and warning."""
    levels = {row.timing.confidence for row in rows if row.timing} - {stats.CONFIDENCE}
    lines = [
        rule_text(rows, new_label=new_label, old_label=old_label), "",
        f"| cell | {old_label} median ms | {new_label} median ms | runs | ratio "
        f"[{'CI, 95% unless named' if levels else '95% CI'}] | verdict | MDE | cost changes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        t = row.timing
        ratio = (f"{t.ratio:.3f} [{t.low:.3f}, {t.high:.3f}]{stats.level(t)}"
                 if t and t.low is not None
                 else f"{t.ratio:.3f}" if t else "-")
        runs = f"{len(row.old.ok) if row.old else 0} / {len(row.new.ok) if row.new else 0}"
        changed = ", ".join(c.metric for c in row.cost_changes) or "none"
        lines.append(f"| {row.name} | {_fmt(row.old and row.old.median_ms)} | "
                     f"{_fmt(row.new and row.new.median_ms)} | {runs} | {ratio} | "
                     f"{row.label} | {_fmt(t and t.mde, '.1%')} | {changed} |")
    flagged = sum(r.verdict in (stats.SLOWER, stats.FASTER) for r in rows)
    under = sum(r.verdict == stats.UNDER for r in rows)
    changed_cells = sum(bool(r.cost_changes) for r in rows)
    lines += ["", f"{flagged} of {len(rows)} cells differ in time beyond noise by at least "
                  f"the minimum effect" + (f", {under} by less (detected, under it)"
                                           if under else "")
              + f"; {changed_cells} changed in cost."]
    details = [f"- {row.name}: {c.text()}" for row in rows for c in row.cost_changes]
    if details:
        lines += ["", "Cost changes (exact; old -> new):", *details]
    warned = [f"- {row.name}: {w}" for row in rows for w in row.warnings]
    if warned:
        lines += ["", "Warnings:", *warned]
    return "\n".join(lines) + "\n"


def to_json(rows: Sequence[CellComparison]) -> dict:
    """The rows as JSON; each timing carries the minimum effect and process spread it was
    judged by, and `rule` says them in words (as `markdown` prints them)."""
    return {"cells": [row.to_json() for row in rows],
            "rule": {"confidence": stats.CONFIDENCE, "min_pairs": stats.MIN_PAIRS,
                     "min_steps": stats.MIN_STEPS,
                     "used": stats.rule([row.timing for row in rows if row.timing])}}
