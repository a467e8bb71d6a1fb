"""`parity explain`: why two plans, or two traced windows, of one cell differ, by operation.

Two records (plans, or runs with a compiled cost) are compared by reports.movers: per
category (harness.xla.categories) and optimizer step, runs, matmul FLOPs, HBM bytes and
collective bytes, as the records carry them, or, for a plan made before records carried
them, split here from the HLO `parity plan --save-hlo` kept.

Two captures (`parity run --trace`, or any capture `parity trace` reads) are explained by
harness.measure.trace_diff: per device, per op and category, device time per traced step.

Two plans are also explained by what holds each one's planned peak (reports.peak): the
buffers of XLA's buffer assignment at the peak executable, matched by defining operation
and shape, their changes summing to the planned peak's change to the byte.
"""

from __future__ import annotations

from pathlib import Path

from harness.measure import trace, trace_diff
from harness.xla import categories
from reports import cause, movers
from reports.compare import Cell, compare_cells, regressions
from reports.movers import FIGURES, Explanation, Totals, markdown, to_json
from reports.record import Record, cell_name, read_dir

__all__ = ["FIGURES", "Explanation", "explain", "markdown", "to_json"]


def per_step(record: Record) -> dict[str, Totals]:
    """The record's step by category: as the record carries it (a plan's or a compiled
    cost's `categories_per_step`), else from the HLO a plan kept (`--save-hlo`), each
    executable's split by category times its calls per step. ValueError naming the fix
    where neither is there."""
    where = cell_name(record.arm, record.spec)
    carried = movers.carried(record)
    if carried:
        return carried
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
    """What differs between two records of one cell, by operation category (per_step: as
    the records carry it, else from the HLO a plan kept)."""
    return movers.explain(a, b, per_step)


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


def cause_line(sides: list[tuple[list[Record] | None, Record | None]]) -> str:
    """`parity explain`'s cause line (reports.cause) for two sides, each (its records, the
    record explained; None where a side is a capture): the interventions between the two
    records, and the timing of every timed ok record of each one's cell in its results
    (rounds of one run compared as interleaved pairs)."""
    (records_a, a), (records_b, b) = sides
    if a is None or b is None:
        return cause.cause(None, [])
    same = [[r for r in records if r.ok and r.timing and r.cell_key() == pick.cell_key()]
            for records, pick in ((records_a, a), (records_b, b))]
    timing = None
    if same[0] and same[1]:
        paired = [r.run_id for r in same[0]] == [r.run_id for r in same[1]]
        timing = compare_cells(Cell(a.cell_key(), same[0]), Cell(b.cell_key(), same[1]),
                               paired=paired).timing
    return cause.cause(timing, cause.interventions(a, b))


def traced_record(records: list[Record] | None, arm: str | None) -> Record | None:
    """The one traced ok record (of `arm` when given) of a side's results, None for a
    capture or where there is not exactly one."""
    if records is None:
        return None
    traced = [r for r in records if r.ok and r.trace is not None
              and (arm is None or r.arm == arm)]
    return traced[0] if len(traced) == 1 else None


TOP = 5
"""Movers shown under each regressed cell."""


def _traced(records: list[Record]) -> Record | None:
    return next((r for r in records if r.trace is not None
                 and Path(r.trace.xplane).is_file()), None)


def cell_change(old: list[Record], new: list[Record], top: int = TOP) -> str:
    """What differs between one cell's `old` and `new` records: the compiled step's movers
    by category where both sides carry it, and the traced windows' where both were traced
    (their captures still on disk); '' where neither side can say."""
    parts = []
    a, b = _programs(old, None), _programs(new, None)
    if a and b:
        found = explain(a[0], b[0])
        parts.append(markdown(found, top))
        if not found.only_a and not found.only_b and not any(
                row.change(f) for row in found.rows for f in FIGURES):
            parts.append("The compiled step is the same in every category: what differs is "
                         "outside the program (the host's work, the input, the machine).\n")
    ta, tb = _traced(old), _traced(new)
    if ta and tb:
        sides = [trace_diff.read_side(r.trace.xplane, f"{cell_name(r.arm, r.spec)} "
                                                      f"({r.run_id})") for r in (ta, tb)]
        parts.append(trace_diff.markdown(trace_diff.explain(*sides), top))
    return "\n".join(parts)


def explained(row, top: int = TOP) -> str:
    """The block under one compared cell (a row of reports.compare.compare_sets): what
    differs (`cell_change`, under reports.cause.DIFFERS), then the cause line: the one
    intervention between the sides' records where it moved the time (reports.cause)."""
    if not (row.old and row.old.ok and row.new and row.new.ok):
        return "One side has no finished run to compare (its failure is above).\n"
    text = cell_change(row.old.ok, row.new.ok, top) or (
        "Neither a compiled step by category nor two traced windows on both sides: run the "
        "cell with --trace (or plan it) on both to see which operations differ.\n")
    changes = cause.interventions(row.old.ok[0], row.new.ok[0])
    return f"{cause.DIFFERS}\n\n{text}\n{cause.cause(row.timing, changes)}\n"


def changes(rows, *, cost_threshold: float = 0.0, top: int = TOP) -> list[tuple[str, str]]:
    """(cell, what differs there and its cause) for every cell
    `reports.compare.regressions` calls a regression (rows of `compare_sets`)."""
    return [(row.name, explained(row, top)) for row in rows
            if regressions([row], cost_threshold=cost_threshold)]


def what_changed(rows, *, cost_threshold: float = 0.0, top: int = TOP) -> str:
    """`changes` as markdown, a heading per regressed cell."""
    return "\n".join(f"### What differs: {name}\n\n{text}"
                      for name, text in changes(rows, cost_threshold=cost_threshold, top=top))
