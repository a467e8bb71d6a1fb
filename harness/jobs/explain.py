"""`parity explain`: why two plans, or two traced windows, of one cell differ, by operation.

Each side is a plan record whose executables' optimized HLO was kept (`parity plan
--save-hlo`). Per side and category (harness.xla.categories), over one optimizer step:
instruction runs, matmul FLOPs, HBM bytes and collective bytes, each executable's figures
times its calls per step, loops counted as they run (harness.xla.counts). The rows are
ordered by how much they moved (the largest change of bytes first); categories present on
one side only are named. Every figure is the compiler's, per device, exact: a change is a
change of the program, not noise.

Two captures (`parity run --trace`, or any capture `parity trace` reads) are explained by
harness.measure.trace_diff: per device, per op and category, device time per traced step.

Two plans are also explained by what holds each one's planned peak (reports.peak): the
buffers of XLA's buffer assignment at the peak executable, matched by defining operation
and shape, their changes summing to the planned peak's change to the byte.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.measure import trace, trace_diff
from harness.xla import categories
from harness.xla.categories import Totals
from reports import peak as peak_change
from reports.record import Record, cell_name, read_dir

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
    peak: peak_change.PeakChange | None = None
    """What holds each side's planned peak, matched (plans only)."""
    peak_unavailable: str | None = None
    """Why `peak` is None where both sides are plans."""


def per_step(record: Record) -> dict[str, Totals]:
    """The record's step by category: as the record carries it (a plan's or a compiled
    cost's `categories_per_step`), else from the HLO a plan kept (`--save-hlo`), each
    executable's split by category times its calls per step. ValueError naming the fix
    where neither is there."""
    where = cell_name(record.arm, record.spec)
    carried = (record.plan.categories_per_step if record.plan is not None
               else record.cost.categories_per_step if record.cost is not None else {})
    if carried:
        return {category: Totals(**figures) for category, figures in carried.items()}
    plan = record.plan
    if plan is None or not plan.hlo_dir:
        raise ValueError(f"{where}: the record carries no step by category (made before "
                         "parity recorded one); plan or run the cell again")
    texts = {}
    for name, executable in plan.executables.items():
        path = Path(plan.hlo_dir) / f"{name}.hlo.txt"
        if executable.calls_per_step and not path.is_file():
            raise ValueError(f"{where}: {path} is missing; plan it again with --save-hlo")
        if executable.calls_per_step:
            texts[name] = path.read_text()
    calls = {name: e.calls_per_step for name, e in plan.executables.items()}
    found = categories.per_step(texts, calls)
    if not found:
        raise ValueError(f"{where}: its kept HLO cannot be counted by category")
    return {category: Totals(**figures) for category, figures in found.items()}


def explain(a: Record, b: Record) -> Explanation:
    """What changed between two plan records of one cell, by operation category."""
    sides = per_step(a), per_step(b)
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


def _programs(records: list[Record], arm: str | None) -> list[Record]:
    """The ok records of `arm` (any arm when None) whose step can be split by category: a
    plan, or a run's compiled cost."""
    return [r for r in records if r.ok and (arm is None or r.arm == arm)
            and (r.plan is not None or (r.cost is not None and r.cost.categories_per_step))]


def pick(records: list[Record] | None, where: str, arm: str | None) -> Record:
    """The record of the one cell in `records` (of `arm` when given) whose step can be
    split by category: its plan, else its compiled cost (rounds of one cell compile the
    same program: the first is taken). ValueError naming the candidates where there is no
    such cell or more than one, or where `where` is a capture (`records` None)."""
    if records is None:
        raise ValueError(f"{where}: a capture, not results; explain it with another capture")
    found = _programs(records, arm)
    cells = sorted({cell_name(r.arm, r.spec) for r in found})
    if len(cells) != 1:
        raise ValueError(f"{where}: {len(cells)} cells with a plan or compiled cost"
                         f"{f' of arm {arm}' if arm else ''} ({', '.join(cells) or 'none'}); "
                         "give --arm, or results of one cell")
    plans = [r for r in found if r.plan is not None]
    return (plans or found)[0]


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
    what = {"count": "", "flops": "matmul ", "hbm_bytes": "HBM ",
            "collective_bytes": "collective "}
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


PLAN, TRACE = "plan", "trace"


def records_at(path: Path) -> list[Record] | None:
    """The records of side `path`, or None where it is a capture (an .xplane.pb, or a
    directory holding no results)."""
    if path.is_file() and path.name.endswith(".xplane.pb"):
        return None
    if path.is_dir() and not any(path.rglob("*.jsonl")):
        return None
    return read_dir(path)


def capture_of(path: Path, records: list[Record] | None, arm: str | None) -> tuple[str, str]:
    """(the .xplane.pb, a label) of side `path` (its `records_at`): a capture file, a
    capture's logdir, or results holding one traced record (of `arm` when given).
    ValueError naming the fix."""
    if records is None:
        if path.is_file():
            return str(path), str(path)
        try:
            return trace.find_xplane(str(path)), str(path)
        except FileNotFoundError:
            raise ValueError(f"{path}: no results (*.jsonl) and no .xplane.pb below it") from None
    traced = [r for r in records if r.ok and r.trace is not None
              and (arm is None or r.arm == arm)]
    if len(traced) != 1:
        names = ", ".join(sorted(cell_name(r.arm, r.spec) for r in traced)) or "none"
        raise ValueError(f"{path}: {len(traced)} traced records{f' of arm {arm}' if arm else ''}"
                         f" ({names}); give --arm, or results of one cell run with --trace")
    record = traced[0]
    if not Path(record.trace.xplane).is_file():
        raise ValueError(f"{path}: its capture {record.trace.xplane} is gone; run the cell "
                         "again with --trace")
    return record.trace.xplane, f"{cell_name(record.arm, record.spec)} ({record.run_id})"


def which(records: list[Record] | None, arm: str | None) -> str:
    """PLAN where a side's `records_at` hold a record whose step splits by category (a
    plan, or a run's compiled cost; of `arm` when given), else TRACE (captures and traced
    results)."""
    return PLAN if records is not None and _programs(records, arm) else TRACE


def explain_traces(sides: list[tuple[Path, list[Record] | None]], arm: str | None
                   ) -> trace_diff.TraceExplanation:
    """Two captures of one cell, explained (trace_diff); `sides` are (path, its
    `records_at`)."""
    read = []
    for path, records in sides:
        xplane_path, label = capture_of(path, records, arm)
        try:
            read.append(trace_diff.read_side(xplane_path, label))
        except ValueError:  # already one line naming the fix
            raise
        except Exception as err:  # not an XSpace protobuf: one line, not a traceback
            raise ValueError(f"{xplane_path}: cannot read it as a profiler capture "
                             f"({type(err).__name__}: {err})") from None
    return trace_diff.explain(*read)


TOP = 5
"""Movers shown under each regressed cell."""


def _traced(records: list[Record]) -> Record | None:
    return next((r for r in records if r.trace is not None
                 and Path(r.trace.xplane).is_file()), None)


def cell_change(old: list[Record], new: list[Record], top: int = TOP) -> str:
    """Why one cell's `new` records differ from its `old` ones: the compiled step's movers
    by category where both sides carry it, and the traced windows' where both were traced
    (their captures still on disk); '' where neither side can say."""
    parts = []
    a, b = _programs(old, None), _programs(new, None)
    if a and b:
        found = explain(a[0], b[0])
        parts.append(markdown(found, top))
        if not found.only_a and not found.only_b and not any(
                row.change(f) for row in found.rows for f in FIGURES):
            parts.append("The compiled step is the same in every category: what changed is "
                         "outside the program (the host's work, the input, the machine).\n")
    ta, tb = _traced(old), _traced(new)
    if ta and tb:
        sides = [trace_diff.read_side(r.trace.xplane, f"{cell_name(r.arm, r.spec)} "
                                                      f"({r.run_id})") for r in (ta, tb)]
        parts.append(trace_diff.markdown(trace_diff.explain(*sides), top))
    return "\n".join(parts)


def changes(rows, *, cost_threshold: float = 0.0, top: int = TOP) -> list[tuple[str, str]]:
    """(cell, what changed there) for every cell `reports.compare.regressions` calls a
    regression (rows of `compare_sets`): `cell_change`, or why nothing can be said."""
    from reports.compare import regressions

    found = []
    for row in rows:
        if not regressions([row], cost_threshold=cost_threshold):
            continue
        if not (row.old and row.old.ok and row.new and row.new.ok):
            text = "One side has no finished run to compare (its failure is above).\n"
        else:
            text = cell_change(row.old.ok, row.new.ok, top) or (
                "Neither a compiled step by category nor two traced windows on both sides: "
                "run the cell with --trace (or plan it) on both to see which operations "
                "moved.\n")
        found.append((row.name, text))
    return found


def what_changed(rows, *, cost_threshold: float = 0.0, top: int = TOP) -> str:
    """`changes` as markdown, a heading per regressed cell."""
    return "\n".join(f"### What changed: {name}\n\n{text}"
                     for name, text in changes(rows, cost_threshold=cost_threshold, top=top))
