"""`parity explain`: why two plans of one cell differ, by operation category.

Each side is a plan record whose executables' optimized HLO was kept (`parity plan
--save-hlo`). Per side and category (harness.xla.categories), over one optimizer step:
instruction runs, matmul FLOPs, HBM bytes and collective bytes, each executable's figures
times its calls per step, loops counted as they run (harness.xla.counts). The rows are
ordered by how much they moved (the largest change of bytes first); categories present on
one side only are named. Every figure is the compiler's, per device, exact: a change is a
change of the program, not noise.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.xla.categories import Totals, by_category
from reports.record import Record, cell_name

FIGURES = ("count", "flops", "hbm_bytes", "collective_bytes")


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


def per_step(record: Record) -> dict[str, Totals]:
    """The record's step by category: each running executable's HLO (kept by `--save-hlo`)
    split by category, times its calls per step. ValueError naming the fix where the HLO
    was not kept or is gone."""
    where = cell_name(record.arm, record.spec)
    plan = record.plan
    if plan is None:
        raise ValueError(f"{where}: not a plan record; explain two `parity plan --save-hlo` "
                         "results")
    if not plan.hlo_dir:
        raise ValueError(f"{where}: the plan kept no HLO; plan it again with --save-hlo")
    found: dict[str, Totals] = {}
    for name, executable in plan.executables.items():
        if not executable.calls_per_step:
            continue
        path = Path(plan.hlo_dir) / f"{name}.hlo.txt"
        if not path.is_file():
            raise ValueError(f"{where}: {path} is missing; plan it again with --save-hlo")
        for category, totals in by_category(path.read_text()).items():
            into = found.setdefault(category, Totals())
            for figure in FIGURES:
                setattr(into, figure, getattr(into, figure)
                        + executable.calls_per_step * getattr(totals, figure))
    return found


def explain(a: Record, b: Record) -> Explanation:
    """What changed between two plan records of one cell, by operation category."""
    sides = per_step(a), per_step(b)
    names = list(dict.fromkeys([*sides[0], *sides[1]]))
    rows = [Row(c, sides[0].get(c, Totals()), sides[1].get(c, Totals())) for c in names]
    rows.sort(key=lambda row: -row.moved)
    return Explanation(
        a=f"{cell_name(a.arm, a.spec)} ({a.run_id})", b=f"{cell_name(b.arm, b.spec)} ({b.run_id})",
        rows=rows, only_a=[c for c in names if c not in sides[1]],
        only_b=[c for c in names if c not in sides[0]])


def pick(records: list[Record], where: str, arm: str | None) -> Record:
    """The one plan record in `records` (of `arm` when given); ValueError naming the
    candidates when there is none or more than one."""
    found = [r for r in records if r.ok and r.plan is not None
             and (arm is None or r.arm == arm)]
    if len(found) != 1:
        names = ", ".join(sorted(cell_name(r.arm, r.spec) for r in found)) or "none"
        raise ValueError(f"{where}: {len(found)} plan records"
                         f"{f' of arm {arm}' if arm else ''} ({names}); give --arm, or "
                         "results of one cell planned with --save-hlo")
    return found[0]


BYTES = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
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
    what = {"count": "", "flops": "", "hbm_bytes": "HBM ", "collective_bytes": "collective "}
    header = ["category"] + [f"{what[f]}{units[f][0]} {side}" for f in FIGURES
                             for side in ("A", "B", "B-A")]
    lines = [f"A: {found.a}", f"B: {found.b}", "",
             "Per device and optimizer step, XLA's plan (exact; loops counted as they run), "
             "the largest movers first.", "",
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
    return "\n".join(lines) + "\n"


def to_json(found: Explanation, top: int | None = None) -> dict:
    return {"a": found.a, "b": found.b, "only_a": found.only_a, "only_b": found.only_b,
            "rows": [{"category": r.category, "a": dataclasses.asdict(r.a),
                      "b": dataclasses.asdict(r.b)} for r in found.rows[:top]]}
