"""`parity nightly`: run a suite, append to the history, flag regressions, exit 0/1/2; and
`parity publish`: the history as a static site (reports.site)."""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path

from harness import regression, results
from reports import site
from reports.record import Record

EXIT_OK, EXIT_REGRESSION, EXIT_BROKEN = 0, 1, 2
SUITES = Path(__file__).parent / "suites"
"""The named suites (harness.grid.SUITES_DIR; read here without importing the grid, which
imports JAX)."""


def summary_markdown(rows: list[regression.NightlyRow], threshold: float) -> str:
    lines = [
        "# Nightly parity", "",
        f"Regression = median ms/step at least {threshold:.0%} above the comparable history "
        f"(last {regression.BASELINE_RUNS} runs of the same arm, config and environment) with "
        "the 95% CI of the ratio (bootstrap over runs, then steps) above 1.00; with too few "
        "runs a side for 95% to be reachable (under e.g. 4 + 4), above the process-spread "
        "bound too (reports.stats.spread_bound); or any cost metric (compiled "
        "FLOPs, bytes accessed, planned peak, executions per step, compiles; with --plan, "
        "the target's planned peak, resident state, HBM, FLOPs and collective bytes) above "
        "the latest comparable run's, compared exactly.", "",
        "| cell | status | median ms | history median ms | runs new / old "
        "| ratio new/old [95% CI] | timing verdict | MDE | cost changes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for row in rows:
        cell, c = row.cell, row.comparison
        median = cell.median_ms
        if c and c.timing:
            t = c.timing
            changed = ", ".join(ch.metric for ch in c.cost_changes) or "none"
            lines.append(
                f"| {cell.name} | {row.status} | {median:.1f} | {c.old.median_ms:.1f} | "
                f"{len(cell.ok)} / {len(c.old.ok)} | {t.ratio:.3f} [{t.low:.3f}, "
                f"{t.high:.3f}] | {c.verdict} | {t.mde:.1%} | {changed} |")
            notes += [f"- {cell.name}: {ch.text()}" for ch in c.cost_changes]
            notes += [f"- {cell.name}: {w}" for w in c.warnings]
        else:
            failed = [r for r in cell.records if not r.ok]
            reason = f": {failed[0].error.reason}" if failed and not cell.ok else ""
            plan = cell.ok and cell.ok[0].plan
            what = f"plan on {plan.target}" if plan else "-"
            changed = (", ".join(ch.metric for ch in c.cost_changes) or "none") if c else "-"
            lines.append(f"| {cell.name} | {row.status}{reason} | "
                         f"{'-' if median is None else f'{median:.1f}'} | - | - | - | {what} "
                         f"| - | {changed} |")
            if c:
                notes += [f"- {cell.name}: {ch.text()}" for ch in c.cost_changes]
    if notes:
        lines += ["", "Cost changes and warnings:", *notes]
    if any(row.status == regression.FIRST for row in rows):
        lines += ["", "Cells without comparable history (other versions, backend, device or "
                      "config) are not compared; they start a new baseline."]
    return "\n".join(lines) + "\n"


def history_plot(row: regression.NightlyRow, path: Path) -> Path:
    """Every history run's step times and the new runs', with the per-run medians."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [*row.history, *row.cell.ok]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=100)
    for i, r in enumerate(runs):
        ax.scatter([i] * len(r.timing.step_ms), r.timing.step_ms, s=6,
                   color="tab:red" if r in row.cell.ok else "tab:blue")
    ax.plot(range(len(runs)), [r.timing.stats.median_ms for r in runs], color="k")
    ax.set_xticks(range(len(runs)), [f"{(r.run_id or '?')[:15]}#{r.round}" for r in runs],
                  rotation=45, fontsize=6)
    ax.set_ylim(bottom=0)
    ax.set_ylabel("ms / step")
    ax.set_title(f"{row.cell.name}: history (blue) and this run (red)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def suite_thresholds(records: Sequence[Record]) -> dict[str, float]:
    """Each named suite's `regression_threshold` (the nightly's default for its cells), for
    the suites the records name that are shipped and set one."""
    found = {}
    for name in sorted({r.suite for r in records if r.suite}):
        path = SUITES / f"{name}.toml"
        if path.is_file():
            with path.open("rb") as f:
                threshold = tomllib.load(f).get("regression_threshold")
            if threshold is not None:
                found[name] = float(threshold)
    return found


def publish(history: Sequence[Record], history_dir: Path, out: Path, *,
            threshold: float | None = None, workers: int | None = None,
            flag: str = "-o") -> site.Published:
    """Writes the history's site to `out` (reports.site.publish): every run judged at
    `threshold`, or, where None, at its suite's threshold (else the nightly's 5%), in
    `workers` processes (default: one per CPU)."""
    return site.publish(history, out, source=str(history_dir),
                        threshold=threshold or site.DEFAULT_THRESHOLD,
                        thresholds=None if threshold else suite_thresholds(history),
                        workers=workers, flag=flag)


def published_text(done: site.Published) -> str:
    return (f"site: {done.site}/index.html ({done.cells} cells, {done.runs} runs, "
            f"{done.shapes} shapes; index {done.index_bytes / 1e6:.2f} MB; "
            f"{done.seconds:.1f} s)")


def evaluate(new: list[Record], history_dir: Path, *, threshold: float,
             report_dir: Path, publish_to: Path | None = None) -> tuple[int, str]:
    """Compares `new` (already appended to the history) with the rest of the history; with
    `publish_to`, then republishes the history's site there (a site that cannot be written
    makes the run broken, exit 2, after the summary)."""
    history = results.read_dir(history_dir)
    rows = regression.against_history(new, history, threshold=threshold)
    text = summary_markdown(rows, threshold)
    report_dir.mkdir(parents=True, exist_ok=True)
    regressed = [row for row in rows if row.status == regression.REGRESSION]
    for i, row in enumerate(regressed):
        png = history_plot(row, report_dir / f"regression_{i}.png")
        text += f"\n![{row.cell.name}]({png.name})\n"
    (report_dir / "nightly.md").write_text(text)
    code = EXIT_REGRESSION if regressed else EXIT_OK
    if not new or any(not r.ok for r in new):
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
