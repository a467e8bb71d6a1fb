"""The nightly's report: a markdown summary of its cells' verdicts, and a plot per regression.

Each row of `summary_markdown` is one cell of the night's run against its comparable history
(`reports.regression.against_history`): its status, median step time beside the history's,
the ratio of the two with its 95% CI, the timing verdict, the smallest change the samples
could detect, and the exact cost metrics that changed; notes under the table spell out each
cost change and each warning. `history_plot` draws a regressed cell's history runs and the
night's runs, step by step, with each run's median.
"""

from __future__ import annotations

from pathlib import Path

from reports import stats
from reports.regression import BASELINE_RUNS, FIRST, NightlyRow


def summary_markdown(rows: list[NightlyRow], threshold: float | None) -> str:
    """The night's summary: the rule, a table row per cell of `rows` (judged at
    `threshold`; None: each backend's minimum effect), then the cost changes and warnings,
    and what a first run means."""
    timings = [row.comparison.timing for row in rows
               if row.comparison and row.comparison.timing]
    at = (f"at least {stats.percent(threshold)}" if threshold is not None else
          "at least the backend's minimum effect")
    used = stats.rule(timings)
    lines = [
        "# Nightly parity", "",
        f"Regression = median ms/step slower than the comparable history (last "
        f"{BASELINE_RUNS} runs of the same arm, config and environment) beyond noise by "
        f"{at} (ratio of medians, 95% CI by a bootstrap over runs, then steps; with too few "
        "runs a side for 95% to be reachable, e.g. under 4 + 4, the CI must clear the "
        "process-spread bound too); or any cost metric (compiled FLOPs, bytes accessed, "
        "planned peak, executions per step, compiles; with --plan, the target's planned "
        "peak, resident state, HBM, FLOPs and collective bytes) above the latest comparable "
        f"run's, compared exactly. {stats.LEGEND}"
        + (f" Used for these runs: {used}." if used else ""), "",
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
                f"{t.high:.3f}] | {c.label} | {t.mde:.1%} | {changed} |")
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
        if row.new_baseline:
            notes.append(f"- {cell.name}: not compared (a new baseline): "
                         + "; ".join(row.new_baseline))
    if notes:
        lines += ["", "Cost changes, new baselines and warnings:", *notes]
    if any(row.status == FIRST for row in rows):
        lines += ["", "Cells without comparable history (other versions, backend, device or "
                      "config) are not compared; they start a new baseline."]
    return "\n".join(lines) + "\n"


def history_plot(row: NightlyRow, path: Path) -> Path:
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
