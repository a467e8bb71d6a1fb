"""Why two records of one cell differ, by operation, from what the records carry: each
side's step by category (a plan's or a compiled cost's `categories_per_step`,
harness.xla.categories), and, for two plans, what holds each planned peak (reports.peak).

Per category and optimizer step: instruction runs, matmul FLOPs, HBM bytes and collective
bytes, each executable's figures times its calls per step, loops counted as they run. The
rows are ordered by how much they moved (the largest change of bytes first); categories
present on one side only are named. Every figure is the compiler's, per device, exact: a
change is a change of the program, not noise. `parity explain` (harness.jobs.explain) adds
what only the harness can read (kept HLO files, traces); the dashboard reads this alone.
"""

from __future__ import annotations

import dataclasses

from reports import peak as peak_change
from reports.record import Record, cell_name

FIGURES = ("count", "flops", "hbm_bytes", "collective_bytes")


@dataclasses.dataclass
class Totals:
    """One category's instructions over one call of a module (or a step), loops as they
    run."""

    count: float = 0.0
    """Instruction runs."""
    flops: float = 0.0
    hbm_bytes: float = 0.0
    collective_bytes: float = 0.0


@dataclasses.dataclass(frozen=True)
class Row:
    category: str
    a: Totals
    b: Totals

    def change(self, figure: str) -> float:
        return getattr(self.b, figure) - getattr(self.a, figure)

    @property
    def moved(self) -> float:
        """How far this category moved: its largest change of bytes (HBM or collective),
        else of FLOPs, else of runs."""
        return max(abs(self.change("hbm_bytes")), abs(self.change("collective_bytes")),
                   abs(self.change("flops")) / 1e3, abs(self.change("count")))


@dataclasses.dataclass(frozen=True)
class Explanation:
    a: str
    b: str
    """The two sides, as people name them (cell and run id)."""
    rows: list[Row]
    """Every category of either side, the largest mover first."""
    only_a: list[str]
    only_b: list[str]
    peak: peak_change.PeakChange | None = None
    """What holds each side's planned peak, matched (plans only)."""
    peak_unavailable: str | None = None
    """Why `peak` is None where both sides are plans."""


def carried(record: Record) -> dict[str, Totals]:
    """The record's step by category as it carries it ({} where it carries none)."""
    found = (record.plan.categories_per_step if record.plan is not None
             else record.cost.categories_per_step if record.cost is not None else {})
    return {category: Totals(**figures) for category, figures in found.items()}


def explain(a: Record, b: Record, per_step=None) -> Explanation:
    """What differs between two records of one cell, by operation category; `per_step`
    reads a record's step by category (default: `carried`)."""
    sides = (per_step or carried)(a), (per_step or carried)(b)
    names = list(dict.fromkeys([*sides[0], *sides[1]]))
    rows = [Row(c, sides[0].get(c, Totals()), sides[1].get(c, Totals())) for c in names]
    rows.sort(key=lambda row: -row.moved)
    held, why = None, None
    if a.plan is not None and b.plan is not None:
        try:
            held = peak_change.compare(a.plan, b.plan)
        except ValueError as err:
            why = str(err)
    return Explanation(
        a=f"{cell_name(a.arm, a.spec)} ({a.run_id})", b=f"{cell_name(b.arm, b.spec)} ({b.run_id})",
        rows=rows, only_a=[c for c in names if c not in sides[1]],
        only_b=[c for c in names if c not in sides[0]], peak=held, peak_unavailable=why)


BYTES = peak_change.UNITS
NAMES = {"flops": "matmul", "hbm_bytes": "HBM", "collective_bytes": "collective"}
"""How a figure is named beside its unit (runs need no name)."""
FLOPS = (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("FLOP", 1))


def _units(found: Explanation) -> dict[str, tuple[str, float]]:
    """Per figure, the unit its largest value in the table reads best in."""
    units = {"count": ("runs", 1.0)}
    for figure, scale in (("hbm_bytes", BYTES), ("collective_bytes", BYTES),
                          ("flops", FLOPS)):
        largest = max((abs(getattr(side, figure)) for row in found.rows
                       for side in (row.a, row.b)), default=0.0)
        units[figure] = next(((n, v) for n, v in scale if largest >= v), scale[-1])
    return units


def markdown(found: Explanation, top: int | None = None) -> str:
    """The explanation as a table a PR can carry (the `top` movers, or every category)."""
    units = _units(found)
    what = {f: f"{NAMES[f]} " if f in NAMES else "" for f in FIGURES}
    header = ["category"] + [f"{what[f]}{units[f][0]} {side}" for f in FIGURES
                             for side in ("A", "B", "B-A")]
    lines = [f"A: {found.a}", f"B: {found.b}", "",
             "Per device and optimizer step, the compiled program's figures (XLA's plan, or "
             "the compiled cost of a run; exact, loops counted as they run), the largest "
             "movers first.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in found.rows[:top]:
        cells = [row.category]
        for figure in FIGURES:
            scale = units[figure][1]
            digits = 0 if figure == "count" else 3
            cells += [f"{getattr(row.a, figure) / scale:,.{digits}f}",
                      f"{getattr(row.b, figure) / scale:,.{digits}f}",
                      f"{row.change(figure) / scale:+,.{digits}f}"]
        lines.append("| " + " | ".join(cells) + " |")
    for label, names in (("A", found.only_a), ("B", found.only_b)):
        if names:
            lines.append(f"\nOnly in {label}: {', '.join(names)}.")
    if found.peak is not None:
        lines += ["", peak_change.markdown(found.peak, top).rstrip("\n")]
    elif found.peak_unavailable:
        lines += ["", f"What holds the planned peak: not known ({found.peak_unavailable})."]
    return "\n".join(lines) + "\n"


def to_json(found: Explanation, top: int | None = None) -> dict:
    return {"a": found.a, "b": found.b, "only_a": found.only_a, "only_b": found.only_b,
            "rows": [{"category": r.category, "a": dataclasses.asdict(r.a),
                      "b": dataclasses.asdict(r.b)} for r in found.rows[:top]],
            "peak": peak_change.to_json(found.peak, top) if found.peak else None,
            "peak_unavailable": found.peak_unavailable}


def line(a: Record, b: Record, top: int = 3) -> str:
    """The `top` movers between two records in one line ('' where a side carries no step
    by category): what a dashboard shows on a regression's point."""
    if not carried(a) or not carried(b):
        return ""
    found = explain(a, b)
    units = _units(found)
    parts = []
    for row in found.rows[:top]:
        shown = {f: f"{row.change(f) / units[f][1]:+,.{0 if f == 'count' else 3}f}"
                 for f in FIGURES}
        moved = [f"{shown[f]} {units[f][0]}{'' if f == 'count' else ' ' + NAMES[f]}"
                 for f in FIGURES if shown[f].strip("+-0.,")]  # what rounds to 0 did not move
        if moved:
            parts.append(f"{row.category} {', '.join(moved)}")
    return "; ".join(parts)

