"""What holds two plans' peaks, matched: the rows of XLA's buffer assignment of the
executable at each plan's planned peak (`ExecutablePlan.peak_buffers`, harness.xla.peak),
paired by section, defining operation and shape, the new and grown first.

A plan's planned peak is its peak executable's argument + output + temp - alias plus the
train state held outside it (`held_bytes`); that executable's rows sum to the first part
to the byte (a `rest` row names what XLA's totals carry beyond the rows read from its
dumped assignment), and `held` is a row of its own. So the rows' changes sum exactly to the
change of the planned peak: checked here, a second count of the same figure, before
anything is shown.
"""

from __future__ import annotations

import dataclasses

from reports.record import Plan

HELD = ("held", "train state outside the executable", "")
REST = "rest"
"""harness.xla.peak.REST: the `defined_by` of a section's remainder row."""
UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))


@dataclasses.dataclass(frozen=True)
class Row:
    section: str
    defined_by: str
    shape: str
    a_count: int
    a_bytes: int
    b_count: int
    b_bytes: int

    @property
    def change(self) -> int:
        return self.b_bytes - self.a_bytes


@dataclasses.dataclass(frozen=True)
class PeakChange:
    a_executable: str
    b_executable: str
    a_peak: int
    b_peak: int
    """Each side's planned peak per device (bytes)."""
    rows: list[Row]
    """Every row of either side: grown or new first (largest first), then shrunk or gone,
    then unchanged."""

    @property
    def change(self) -> int:
        return self.b_peak - self.a_peak


def _rows(plan: Plan) -> dict[tuple[str, str, str], tuple[int, int]]:
    executable = plan.executables[plan.peak_executable]
    if not executable.peak_buffers:
        why = executable.peak_unavailable or "planned before plans kept their peak's buffers"
        raise ValueError(f"its peak executable {plan.peak_executable} has no buffer rows "
                         f"({why}); plan it again")
    rows = {(g["section"], g["defined_by"], g["shape"]): (g["count"], g["bytes"])
            for g in executable.peak_buffers}
    rows[HELD] = (0, executable.held_bytes)
    return rows


def compare(a: Plan, b: Plan) -> PeakChange:
    """The two plans' peak rows matched; ValueError (one line) where a side has none or
    where the rows do not sum to its planned peak."""
    sides = []
    for label, plan in (("A", a), ("B", b)):
        try:
            rows = _rows(plan)
        except ValueError as err:
            raise ValueError(f"{label}: {err}") from None
        counted = sum(size for _, size in rows.values())
        if counted != plan.planned_peak_bytes:
            raise ValueError(f"{label}: its peak rows sum to {counted} bytes, its planned peak "
                             f"is {plan.planned_peak_bytes}")
        sides.append(rows)
    keys = list(dict.fromkeys([*sides[0], *sides[1]]))
    rows = [Row(*key, *sides[0].get(key, (0, 0)), *sides[1].get(key, (0, 0))) for key in keys]
    rows.sort(key=lambda r: (r.change <= 0, r.change == 0, -abs(r.change), r.section,
                             r.defined_by, r.shape))
    return PeakChange(a.peak_executable, b.peak_executable, a.planned_peak_bytes,
                      b.planned_peak_bytes, rows)


def _unit(change: PeakChange) -> tuple[str, int]:
    largest = max([abs(r.a_bytes) for r in change.rows] + [abs(r.b_bytes) for r in change.rows]
                  + [1])
    return next((n, v) for n, v in UNITS if largest >= v)


def markdown(change: PeakChange, top: int | None = None) -> str:
    """The matched rows as a table (the `top` movers, or all), and the sum they make."""
    unit, scale = _unit(change)
    shown = _shown(change, top)
    lines = [f"What holds the planned peak (XLA's buffer assignment of the peak executable, "
             f"per device; A: `{change.a_executable}`, B: `{change.b_executable}`): "
             f"{change.a_peak / scale:,.3f} -> {change.b_peak / scale:,.3f} {unit} "
             f"({change.change:+,} bytes), the new and grown first.", "",
             f"| section | defined by | shape | A count | A {unit} | B count | B {unit} | "
             f"B-A {unit} |", "|---|---|---|---|---|---|---|---|"]
    for r in shown:
        lines.append(f"| {r.section} | {r.defined_by} | {r.shape or '-'} | {r.a_count} | "
                     f"{r.a_bytes / scale:,.3f} | {r.b_count} | {r.b_bytes / scale:,.3f} | "
                     f"{r.change / scale:+,.3f} |")
    summed = sum(r.change for r in change.rows)
    hidden = len([r for r in change.rows if r.change]) - len([r for r in shown if r.change])
    lines.append("")
    lines.append(f"The rows' changes sum to {summed:+,} bytes, the planned peak's change"
                 + (f" ({hidden} smaller movers not shown)." if hidden > 0 else "."))
    rest = [r for r in change.rows if r.defined_by == REST and r.change]
    if rest:
        lines.append("`rest`: what XLA's totals carry beyond the buffers its dumped assignment "
                     f"places ({', '.join(f'{r.section} {r.change:+,} bytes' for r in rest)}).")
    return "\n".join(lines) + "\n"


def _shown(change: PeakChange, top: int | None) -> list[Row]:
    """The `top` rows that moved, or every row."""
    return [r for r in change.rows if r.change][:top] if top else change.rows


def to_json(change: PeakChange, top: int | None = None) -> dict:
    shown = _shown(change, top)
    return {"a_executable": change.a_executable, "b_executable": change.b_executable,
            "a_peak": change.a_peak, "b_peak": change.b_peak, "change": change.change,
            "rows": [dataclasses.asdict(r) | {"change": r.change} for r in shown]}
