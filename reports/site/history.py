"""A nightly history as the dashboard shows it: cells, their runs, each run's verdict.

A dashboard *cell* is what people name a benchmark: arm x preset x shape x GA x dtype x mesh
x backend (`CellId`). Over a year its records span several comparability keys
(`Record.cell_key`: a jax upgrade, an XLA flag, a changed config each start a new key), and
records of two keys are never compared. Each run of a cell (its records of one run id) is
judged exactly as `parity nightly` judged it when it ran: `reports.regression.judge` against
the ok records of the same key from the runs before it. Nothing here is a statistic or rule
of its own: medians and CIs are `reports.medians` and `reports.stats`, verdicts
`reports.regression`, cost values `reports.costs`, comparability `Record.cell_key` and
`Environment.COMPARABLE`.

Timed runs and plan runs (`parity nightly --plan`: XLA's plan for a TPU target, no timing)
are kept apart: they have their own keys and run ids.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Iterable, Sequence

from reports import costs, medians, movers, stats
from reports.compare import Cell
from reports.record import Environment, Record, path_safe
from reports.regression import (
    BASELINE_RUNS,
    COMPILER,
    FAILED,
    FIRST,
    REGRESSION,
    NightlyRow,
    environment_changes,
    is_plan,
    judge,
    key_changes,
)

OK, REGRESSED, IMPROVED, BROKEN, NOT_COMPARABLE = (
    "ok", "regression", "improvement", "failed", "not comparable")
VERDICTS = (OK, REGRESSED, IMPROVED, BROKEN, NOT_COMPARABLE)
"""A run's verdict on the dashboard: the nightly's status (`reports.regression`) with "ok"
split into "improvement" where the timing verdict is faster beyond noise, and "first run
(baseline)" called "not comparable" (no earlier run shares its key)."""

TIMED, PLANNED = "timed", "plan"


@dataclasses.dataclass(frozen=True, kw_only=True, order=True)
class CellId:
    """One dashboard cell: the benchmark as people name it, across environments."""

    arm: str
    """The arm (trainer x model)."""
    preset: str
    """Model preset (tiny, small, qwen3-8b, ...)."""
    seq: int
    """Sequence length."""
    batch: int
    """Rows per optimizer step."""
    ga: int
    """Gradient-accumulation micro-batches per step."""
    dtype: str
    """Compute dtype."""
    mesh: str
    """Mesh spec as given (`fsdp=-1`), '1' for one device."""
    backend: str
    """JAX backend the records ran (or planned) on: cpu, gpu, tpu."""

    @property
    def shape(self) -> tuple:
        """Everything but the arm: the arms of one shape are drawn side by side."""
        return (self.preset, self.seq, self.batch, self.ga, self.dtype, self.mesh,
                self.backend)

    @property
    def name(self) -> str:
        return f"{self.arm} {shape_name(self.shape)}"

    @property
    def slug(self) -> str:
        """A file name for the cell's page (unique per cell)."""
        return path_safe(f"{self.arm}-{shape_slug(self.shape)}")


def shape_name(shape: tuple) -> str:
    preset, seq, batch, ga, dtype, mesh, backend = shape
    return f"{preset} seq={seq} batch={batch} ga={ga} {dtype} mesh={mesh} {backend}"


def shape_slug(shape: tuple) -> str:
    preset, seq, batch, ga, dtype, mesh, backend = shape
    return path_safe(f"{preset}-s{seq}-b{batch}-ga{ga}-{dtype}-m{mesh}-{backend}")


def cell_id(record: Record) -> CellId | None:
    """The record's dashboard cell; None for a record without arm or spec (it names no
    benchmark)."""
    spec = record.spec
    if record.arm is None or spec is None:
        return None
    return CellId(arm=record.arm, preset=spec.preset, seq=spec.seq, batch=spec.batch,
                  ga=spec.ga, dtype=spec.dtype, mesh=spec.mesh or "1",
                  backend=record.environment.backend if record.environment else "unknown")


def kind(record: Record) -> str:
    return PLANNED if is_plan(record) else TIMED


@dataclasses.dataclass(kw_only=True)
class RunView:
    """One run (run id) of one cell and kind, judged as the nightly judged it."""

    run_id: str
    """The run id its records share."""
    time: str
    """ISO timestamp of its first record."""
    records: list[Record]
    """Its records of this cell, in round order."""
    row: NightlyRow
    """`reports.regression.judge` against the comparable runs before it."""
    verdict: str
    """One of `VERDICTS`."""
    why: str
    """The verdict in one line: the ratio and CI, the cost increases, the failure, or what
    changed since the previous run."""
    median: medians.MedianCI | None
    """Median ms/step over its rounds with the run-level 95% CI (medians.median_ci); None
    for a plan or a run with no finished round."""
    cost: dict[str, float | None]
    """Its cost metrics (reports.costs.side_values)."""

    @property
    def environment(self) -> Environment | None:
        return next((r.environment for r in self.records if r.environment), None)

    @property
    def code(self) -> str:
        """The code the run ran, in words (reports.record.Environment.code)."""
        env = self.environment
        return env.code() if env else "?"

    @property
    def comparison(self):
        return self.row.comparison


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
    """A point in a cell's history where records stop being comparable."""

    time: str
    """ISO time of the first run after the change."""
    text: str
    """What changed, e.g. 'jax 0.11.2 -> 0.12.0'."""


@dataclasses.dataclass(kw_only=True)
class CellHistory:
    """Every run of one dashboard cell, oldest first."""

    id: CellId
    """The cell."""
    timed: list[RunView]
    """Its timed runs."""
    plans: list[RunView]
    """Its plan runs (`parity nightly --plan`)."""
    changes: list[Change]
    """Environment and config changes between its runs (records across one are not
    compared)."""
    threshold: float
    """The relative slowdown its verdicts were judged at."""

    @property
    def latest(self) -> RunView | None:
        return self.timed[-1] if self.timed else None

    @property
    def latest_plan(self) -> RunView | None:
        return self.plans[-1] if self.plans else None


def _order(record: Record) -> tuple:
    return (record.timestamp or "", record.round)


def _runs_of_key(records: list[Record]) -> list[list[Record]]:
    """One key's records cut into runs, in order of each run's first record."""
    runs: dict[str | None, list[Record]] = {}
    for record in sorted(records, key=_order):
        runs.setdefault(record.run_id, []).append(record)
    return list(runs.values())


def judged_runs(records: Sequence[Record], *, threshold: float) -> list[RunView]:
    """Every run of `records` (one cell and kind) judged against the comparable runs before
    it, oldest first. The nightly rule reads the last `BASELINE_RUNS` runs with an ok
    record, so only those are kept as each run's history. The timing CI of a run against its
    history is computed where the verdict depends on it (reports.regression.judge with
    full_ci=False: a ratio within the threshold is no regression or improvement whatever its
    CI), which spares a bootstrap of every run."""
    by_key: dict[tuple, list[Record]] = {}
    for record in records:
        by_key.setdefault(record.cell_key(), []).append(record)
    views = []
    for key, group in by_key.items():
        runs = _runs_of_key(group)
        window: collections.deque[list[Record]] = collections.deque(maxlen=BASELINE_RUNS)
        for run in runs:
            cell = Cell(key, sorted(run, key=lambda r: (r.run_id or "", r.round)))
            same = sorted((h for past in window for h in past), key=_order)
            row = judge(cell, same, threshold=threshold, full_ci=False)
            views.append(RunView(
                run_id=run[0].run_id or "?", time=run[0].timestamp or "", records=cell.records,
                row=row, verdict="", why="", median=None, cost=costs.side_values(cell.ok)))
            if cell.ok:
                window.append(cell.ok)
    timed = [(v, runs) for v in views if (runs := v.row.cell.runs)]
    for (view, _), median in zip(timed, medians.median_cis([runs for _, runs in timed]),
                                 strict=True):
        view.median = median
    views.sort(key=lambda v: (v.time, v.run_id))
    return views


def _first(records: Iterable[Record]) -> Record:
    return next(iter(records))


def _name_verdict(view: RunView, previous: RunView | None) -> None:
    """Fills `verdict` and `why` from the nightly's row."""
    row = view.row
    c = row.comparison
    if row.status == FAILED:
        failed = next(r for r in view.records if not r.ok)
        view.verdict = BROKEN
        view.why = f"{failed.error.reason}: {failed.error.message}"[:300]
        return
    if row.status == FIRST:
        view.verdict = NOT_COMPARABLE
        if previous is None:
            view.why = "first run: no history"
        else:
            diff = key_changes(_first(previous.records), _first(view.records))
            view.why = ("new baseline: " + "; ".join(diff) if diff else
                        "new baseline: no earlier run shares its key")
        return
    parts = []
    if c.timing is not None:
        t = c.timing
        ci = f" [{t.low:.3f}, {t.high:.3f}]" if t.low is not None else ""
        runs = len({r.run_id for r in row.history})
        parts.append(f"{stats.label(t)}: {t.ratio:.3f}x{ci} vs the last {runs} comparable "
                     f"run{'s' if runs > 1 else ''} ({len(c.old.ok)} rounds)")
    increases = costs.increases(c.cost_changes)
    if increases:
        parts.append("cost up: " + ", ".join(ch.text() for ch in increases))
    elif c.cost_changes:
        parts.append("cost changed: " + ", ".join(ch.text() for ch in c.cost_changes))
    elif c.timing is None:
        parts.append("every figure as in the latest comparable run (exact)")
    if row.status == REGRESSION:
        view.verdict = REGRESSED
        moved = _moved(row.history, view.records)
        if moved:
            parts.append(f"what differs: {moved}")
    elif c.verdict == stats.FASTER:
        view.verdict = IMPROVED
    else:
        view.verdict = OK
    view.why = "; ".join(parts) or c.verdict


def _moved(history: list[Record], records: list[Record]) -> str:
    """The top movers by operation category (reports.movers.line) between the regressed
    run's first record that carries its step by category and the latest such record of
    the runs it was judged against; '' where either side has none."""
    new = next((r for r in records if r.ok and movers.carried(r)), None)
    old = next((r for r in sorted(history, key=_order, reverse=True)
                if r.ok and movers.carried(r)), None)
    return movers.line(old, new) if old and new else ""


def _named(views: list[RunView]) -> list[RunView]:
    previous = None
    for view in views:
        _name_verdict(view, previous)
        previous = view
    return views


def _changes(timed: list[RunView], plans: list[RunView]) -> list[Change]:
    """Environment changes along every run of the cell (timed and plan runs of one night
    share their environment: one marker), and config, option or (for timed runs) allocator
    changes within each kind: plans compile under their own allocator."""
    found: list[Change] = []
    merged = sorted([*timed, *plans], key=lambda v: (v.time, v.run_id))
    previous = None
    for view in merged:
        env = view.environment
        if env is None:  # a run that died before recording one: nothing to compare
            continue
        if previous is not None:
            diff = environment_changes(previous, env, plan=True)  # the fields both kinds share
            if diff:
                found.append(Change(time=view.time, text="; ".join(diff)))
        previous = env
    for views in (timed, plans):
        for before, after in itertools.pairwise(views):
            a, b = _first(before.records), _first(after.records)
            if a.cell_key() != b.cell_key():
                env = environment_changes(a.environment, b.environment, plan=True)  # marked above
                # A plan's libtpu is its environment's where libtpu is installed: one change.
                diff = [d for d in key_changes(a, b) if d not in env and not (
                    d.startswith(COMPILER) and any(e.startswith("libtpu ") for e in env))]
                if diff:
                    found.append(Change(time=after.time, text="; ".join(diff)))
    found.sort(key=lambda c: c.time)
    return found


def cell_history(cell: CellId, records: Sequence[Record], *, threshold: float) -> CellHistory:
    """One dashboard cell's runs, judged, with the changes between them."""
    timed = _named(judged_runs([r for r in records if kind(r) == TIMED], threshold=threshold))
    plans = _named(judged_runs([r for r in records if kind(r) == PLANNED],
                               threshold=threshold))
    return CellHistory(id=cell, timed=timed, plans=plans, changes=_changes(timed, plans),
                       threshold=threshold)


def slim(history: CellHistory) -> CellHistory:
    """The history as the index and the shape pages read it: each run keeps one record
    without its measurements (for its environment and commit), its verdict, median and cost
    values, and its comparison without the records compared. Small enough to send from the
    process that judged it (reports.site.writer)."""
    def run(view: RunView) -> RunView:
        first = next((r for r in view.records if r.environment), view.records[0])
        bare = dataclasses.replace(first, timing=None, cost=None, memory=None, parity=None,
                                   trace=None, plan=None, phases=None)
        c = view.row.comparison
        row = NightlyRow(Cell(view.row.cell.key, []), view.row.status,
                         dataclasses.replace(c, old=None, new=None) if c else None)
        return dataclasses.replace(view, records=[bare], row=row)

    return dataclasses.replace(history, timed=[run(v) for v in history.timed],
                               plans=[run(v) for v in history.plans])


def by_cell(records: Iterable[Record]) -> dict[CellId, list[Record]]:
    """Records grouped by dashboard cell, cells in sorted order; records naming no cell (no
    arm or spec) are left out."""
    groups: dict[CellId, list[Record]] = {}
    for record in records:
        cid = cell_id(record)
        if cid is not None:
            groups.setdefault(cid, []).append(record)
    return dict(sorted(groups.items()))
