"""`parity nightly`: run a suite, append to the history, flag regressions, exit 0/1/2."""

from __future__ import annotations

from pathlib import Path

from harness import regression, results
from harness.console import cell_name
from reports.record import Record

EXIT_OK, EXIT_REGRESSION, EXIT_BROKEN = 0, 1, 2


def summary_markdown(rows: list[regression.NightlyRow], threshold: float) -> str:
    lines = [
        "# Nightly parity", "",
        f"Regression = median ms/step at least {threshold:.0%} above the comparable history "
        "(last 5 runs of the same arm, config and environment) with the 95% bootstrap CI of "
        "the ratio above 1.00.", "",
        "| cell | status | median ms | history median ms | ratio new/old [95% CI] | MDE |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        r = row.record
        name = cell_name(r.arm, r.spec)
        median = r.timing.stats.median_ms if r.ok else None
        if row.comparison:
            c = row.comparison
            old = sorted(x for h in row.history[-5:] for x in h.timing.step_ms)
            ratio = f"{c.ratio:.3f} [{c.low:.3f}, {c.high:.3f}]"
            lines.append(f"| {name} | {row.status} | {median:.1f} | "
                         f"{old[len(old) // 2]:.1f} | {ratio} | {c.mde:.1%} |")
        else:
            reason = f": {r.error.reason}" if not r.ok else ""
            lines.append(f"| {name} | {row.status}{reason} | "
                         f"{'-' if median is None else f'{median:.1f}'} | - | - | - |")
    compared = [row for row in rows if row.comparison]
    if len(compared) < len([row for row in rows if row.record.ok]):
        lines += ["", "Cells without comparable history (other versions, backend, device or "
                      "config) are not compared; they start a new baseline."]
    return "\n".join(lines) + "\n"


def history_plot(row: regression.NightlyRow, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [*row.history, row.record]
    fig, ax = plt.subplots(figsize=(8, 4), dpi=80)
    for i, r in enumerate(runs):
        ax.scatter([i] * len(r.timing.step_ms), r.timing.step_ms, s=6,
                   color="tab:red" if r is row.record else "tab:blue")
    ax.plot(range(len(runs)), [r.timing.stats.median_ms for r in runs], color="k")
    ax.set_xticks(range(len(runs)), [(r.run_id or "?")[:15] for r in runs], rotation=45,
                  fontsize=6)
    ax.set_ylabel("ms / step")
    ax.set_title(cell_name(row.record.arm, row.record.spec), fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def evaluate(new: list[Record], history_dir: Path, *, threshold: float,
             report_dir: Path) -> tuple[int, str]:
    """Compares `new` (already appended to the history) with the rest of the history."""
    history = results.read_dir(history_dir)
    rows = regression.against_history(new, history, threshold=threshold)
    text = summary_markdown(rows, threshold)
    report_dir.mkdir(parents=True, exist_ok=True)
    regressed = [row for row in rows if row.status == "regression"]
    for i, row in enumerate(regressed):
        png = history_plot(row, report_dir / f"regression_{i}.png")
        text += f"\n![{cell_name(row.record.arm, row.record.spec)}]({png.name})\n"
    (report_dir / "nightly.md").write_text(text)
    if not new or any(row.status == "failed" for row in rows):
        return EXIT_BROKEN, text
    return (EXIT_REGRESSION if regressed else EXIT_OK), text
