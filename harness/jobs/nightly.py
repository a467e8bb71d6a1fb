"""`parity nightly`: run a suite, append to the history, judge each cell against its
comparable history, exit 0/1/2; and `parity publish`: the history as a static site
(reports.site). The judging rule and the markdown are reports' (reports.regression,
reports.nightly); this module runs the grid and writes where the nightly writes."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from harness.grid import suites
from harness.jobs import plan as plan_job
from harness.jobs import run as run_job
from harness.jobs.deadline import CUT, Deadline
from harness.jobs.explain import cell_change
from harness.jobs.grid import Request, Watch, check, quiet
from harness.store import results
from harness.store.layout import OutDir
from reports import cause, site
from reports import nightly as nightly_report
from reports.record import Record, codec
from reports.regression import REGRESSION, against_history

EXIT_OK, EXIT_REGRESSION, EXIT_BROKEN = 0, 1, 2
ROUNDS = 4
"""Default rounds a night: 4 new runs against 4+ history runs is the smallest unpaired
sample whose CI can reach 95% (reports.stats.luck_bound)."""


def prepare(request: Request, *, threshold: float | None, report: Path | None,
            publish_to: Path | None, allow_dirty: bool = False
            ) -> tuple[dict, float | None, Path]:
    """(grid options, threshold, report directory), every value checked before anything
    runs: a corrupt history fails now, not after the grid. The threshold is `threshold`,
    else the suite's `regression_threshold`, else None: each cell's backend's minimum
    effect (reports.stats.default_min_effect). `allow_dirty`: as harness.jobs.grid.check's."""
    history = request.out
    results.check_writable(history, "--history")  # the runs are written there
    if publish_to is not None:
        site.check_output(publish_to, "--publish")
    if codec.results_files(history):
        codec.read_dir(history)
    report_dir = report or OutDir(history).nightly_report
    results.check_writable(report_dir, "--report")
    options = check(request, defaults={"rounds": ROUNDS}, allow_dirty=allow_dirty)
    threshold = threshold or options.get("regression_threshold")
    if threshold is not None and not threshold > 0:
        raise ValueError(f"--threshold {threshold}: give a relative slowdown > 0")
    return options, threshold, report_dir


def nightly(request: Request, options: dict, *, threshold: float | None, report_dir: Path,
            target: dict | None = None, publish_to: Path | None = None,
            run_id: str | None = None, deadline: Deadline | None = None,
            watch: Watch = quiet) -> tuple[int, str]:
    """`parity nightly`: (exit code, the nightly's markdown) of the grid run into the
    history, then with a `target` every cell planned for it, judged against the history.
    A night given the `run_id` of one cut short (a host's time limit, a signal) runs only
    the cells that night has not recorded, then judges every record of the night. A night
    its `deadline` stopped before its last cell is not judged (a part of a night would
    compare fewer rounds than the history's nights): exit 3 and how to resume it."""
    path, records = run_job.run(request, options, run_id=run_id, deadline=deadline,
                                watch=watch)
    if deadline is not None and deadline.cut:
        return CUT, (f"{deadline.summary()}; the night is judged when it is whole "
                     f"({len(records)} cells recorded by this command, in {path})")
    if run_id is not None:  # the night's records from before the cut too
        records = [r for r in codec.read(path) if r.run_id == run_id]
    if target is not None:
        plans = {**options, "rounds": 1, "trace": False}
        records = [*records, *plan_job.plan(request, plans, target, watch=watch)[1]]
    return evaluate(records, request.out, threshold=threshold, report_dir=report_dir,
                    publish_to=publish_to, request=request)


def publish(history: Sequence[Record], history_dir: Path, out: Path, *,
            threshold: float | None = None, workers: int | None = None,
            flag: str = "-o") -> site.Published:
    """Writes the history's site to `out` (reports.site.publish): every run judged at
    `threshold`, or, where None, at its suite's threshold, else at its backend's minimum
    effect (as the nightly), in `workers` processes (default: one per CPU)."""
    return site.publish(history, out, source=str(history_dir), threshold=threshold,
                        thresholds=None if threshold else suites.thresholds(
                            r.suite for r in history if r.suite),
                        workers=workers, flag=flag)


def published_text(done: site.Published) -> str:
    return (f"site: {done.site}/index.html ({done.cells} cells, {done.runs} runs, "
            f"{done.shapes} shapes; index {done.index_bytes / 1e6:.2f} MB; "
            f"{done.seconds:.1f} s)")


def _what_changed(row, request: Request | None) -> str:
    """A regressed cell's block: what differs from the latest comparable run of its history
    (harness.jobs.explain.cell_change) and the cause line (reports.cause), then, where the
    two ran different commits, the `parity bisect` that finds the one that moved the time
    (separate runs, not an A/B, name at most the range)."""
    if not row.history or not row.cell.ok:
        return ""
    latest = [r for r in row.history if r.run_id == row.history[-1].run_id and r.ok]
    if not latest:
        return ""
    found = cell_change(latest, row.cell.ok)
    said = cause.cause(row.comparison.timing if row.comparison else None,
                       cause.interventions(latest[0], row.cell.ok[0]))
    text = (f"\n#### What differs: {row.cell.name} (against run {row.history[-1].run_id})"
            f"\n\n{cause.DIFFERS}\n\n{found}\n{said}\n")
    old, new = latest[0].environment, row.cell.ok[0].environment
    if request is not None and old and new and old.git_sha and new.git_sha and (
            old.git_sha != new.git_sha) and not old.git_dirty and not new.git_dirty:
        cell = row.cell.ok[0]
        one = Request(explicit={**request.explicit, "arms": [cell.arm],
                                "preset": [cell.spec.preset], "seq": [cell.spec.seq],
                                "batch": [cell.spec.batch], "micro_batch": None,
                                "ga": [cell.spec.ga], "rounds": None},
                      suite=request.suite, plugins=request.plugins, out=request.out)
        line = shlex.join(["parity", "bisect", old.git_sha, new.git_sha, *one.argv()])
        text += f"\nThe commit that moved it, by A/B at this cell:\n\n    {line}\n"
    return text


def evaluate(new: list[Record], history_dir: Path, *, threshold: float | None,
             report_dir: Path, publish_to: Path | None = None,
             request: Request | None = None) -> tuple[int, str]:
    """Compares `new` (already appended to the history) with the rest of the history;
    writes the nightly's markdown and a plot per regression to `report_dir`; with
    `publish_to`, then republishes the history's site there (a site that cannot be written
    makes the run broken, exit 2, after the summary)."""
    history = codec.read_dir(history_dir)
    rows = against_history(new, history, threshold=threshold)
    text = nightly_report.summary_markdown(rows, threshold)
    report_dir.mkdir(parents=True, exist_ok=True)
    regressed = [row for row in rows if row.status == REGRESSION]
    for i, row in enumerate(regressed):
        png = nightly_report.history_plot(row, report_dir / f"regression_{i}.png")
        text += f"\n![{row.cell.name}]({png.name})\n"
        text += _what_changed(row, request)
    (report_dir / "nightly.md").write_text(text)
    code = EXIT_REGRESSION if regressed else EXIT_OK
    if not new or any(not r.ok and not r.unavailable for r in new):
        code = EXIT_BROKEN
    if publish_to is not None:
        try:
            # In this process, which imported JAX for the grid: judged here, not in forks.
            text += "\n" + published_text(publish(history, history_dir, publish_to,
                                                  threshold=threshold, workers=1,
                                                  flag="--publish")) + "\n"
        except (ValueError, OSError) as err:
            text += f"\nparity: error: the site was not published ({err})\n"
            code = EXIT_BROKEN
    return code, text
