"""The parity document: a summary first, then the detailed tables folded, per comparable
environment, with PNGs linked beside the markdown or embedded in it."""

from __future__ import annotations

import base64
import dataclasses
import tempfile
from pathlib import Path

import pandas as pd

from reports import baseline, measured, plan, plots, stats, summary, tables
from reports.frame import to_frame
from reports.record import read_dir


def details(title: str, *body: str) -> str:
    """A folded block. The blank line after the <summary> line (and before </details>) is
    what makes GitHub render the markdown inside it."""
    return "\n\n".join([f"<details><summary><b>{title}</b></summary>", *body, "</details>"])


def _image(title: str, path: Path, embed: bool) -> str:
    if embed:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        return f"![{title}](data:image/png;base64,{data})"
    return f"![{title}]({path.name})"


def _section(df: pd.DataFrame, out_dir: Path, prefix: str, baseline_arm: str, how: str,
             embed: bool, plans: pd.DataFrame | None = None) -> str:
    headline = plots.speedups(df, out_dir / f"{prefix}speedup.png", baseline_arm)
    figures = {
        "Step-time distribution": plots.step_time_distribution(
            df, out_dir / f"{prefix}step_times.png"),
        "ms/step vs sequence length": plots.sweep(df, out_dir / f"{prefix}sweep.png"),
        "Memory": plots.memory_bars(df, out_dir / f"{prefix}memory.png"),
    }
    parts = [
        "### Summary", summary.summary(df, baseline_arm, how, plans),
        _image(f"Speedup vs {baseline_arm}", headline, embed),
        details("Setup", tables.setup(df)),
        details("ms/step", "Untraced timing; each round is a separate process, rounds "
                "interleave the arms (A B C, C B A, ...). Median = median of the rounds' "
                "medians, with a 95% bootstrap CI over rounds. Speedup = median(other) / "
                "median(arm): above 1.00x the arm is faster; its bracket is the 95% CI of "
                "reports.stats (bootstrap over rounds, then steps) and slower or faster "
                "needs a difference of at least the backend's minimum effect; with fewer "
                f"rounds than 95% needs (4+ a side; interleaved rounds count as pairs from "
                f"{stats.MIN_PAIRS}), the CI must also clear the process-spread bound "
                f"(reports.stats.spread_bound).{summary.timing_rule(tables.ok(df), baseline_arm)}",
                tables.timing(df, baseline_arm)),
        details("Cost per step", "Model FLOPs: one formula for every arm (MaxText's: 6 x "
                "matmul params x tokens + causal attention; remat recompute excluded). "
                "Compiled FLOPs and bytes: XLA's cost model of every executable x its calls "
                "per step, each while-loop body counted as many times as it runs. All are "
                "exact (no timing noise).", tables.cost(df)),
        details("Peak memory", tables.memory(df, baseline_arm)),
        *([details("Planned vs measured", measured.__doc__.split("\n\n", 1)[1], pvm)]
          if (pvm := measured.planned_vs_measured(df)) else []),
        details("Executables", "XLA's memory_analysis of each compiled executable (per "
                "device); calls/step weights the per-step cost.", tables.executables(df)),
        details("Gradient parity", "rel_l2 = ||g - g_exact|| / ||g_exact||, where g is the "
                "gradient the optimizer saw at step 1 and g_exact = sum_i grad(loss_sum_i) / "
                "sum_i den_i.", tables.losses(df), tables.parity(df)),
        details("Executions, host and device time (traced window)", "From the separate "
                "traced window; these numbers never mix with the untraced timing above. "
                "Tracing tax: the traced window's median step over the untraced median (what "
                "the profiler itself costs a step). Busy: "
                "the union of a step's op intervals, each op until it completed; host: traced "
                "ms - busy, the time no op of the step ran. Dispatch: time inside the arm's "
                "step call, before it returned; a trainer that waits inside its own loop "
                "(PeftTrainer's throttler at GA > 1) counts those waits too. The last column "
                "opens a cell's capture in xprof (`tensorboard --logdir` with the "
                "same directory works too); memory_viewer and graph_viewer need a "
                "`--trace-hlo` capture.",
                tables.traced(df)),
        details("Noise", tables.noise(df, baseline_arm)),
        details("Failed cells", tables.failures(df)),
        details("Plots", *[_image(title, path, embed) for title, path in figures.items()
                           if path is not None]),
    ]
    return "\n\n".join(parts)


def _baseline(df: pd.DataFrame, requested: str | None) -> tuple[str, str]:
    """(the section's baseline arm, how it was chosen)."""
    if requested is not None and requested in set(df["arm"]):
        return requested, "chosen with `--baseline-arm`"
    timed = tables.ok(df)
    failing = {r["arm"] for _, r in timed.iterrows() if tables.fails_parity(r)}
    exact = [arm for arm in timed["arm"] if arm not in failing]
    arm = baseline.default(exact or (timed["arm"] if len(timed) else df["arm"]))
    how = baseline.describe()
    if not exact:
        how += " (no arm passes gradient parity in every cell here, so the first present)"
    if requested is not None:
        return arm, (f"`--baseline-arm {requested}` has no records in this environment; "
                     f"{how}")
    return arm, f"{how}; `--baseline-arm` overrides"


@dataclasses.dataclass(frozen=True)
class Against:
    """The report's results compared with a baseline run's (`parity report --baseline`)."""

    label: str
    """The baseline, as people name it (its path)."""
    comparison: str
    """reports.compare.markdown of the two sets of results."""
    changed: list[tuple[str, str]]
    """(cell, what differs there and its cause) for every cell the comparison calls a
    regression."""


def _against(found: Against) -> str:
    parts = [f"## Against the baseline ({found.label})", found.comparison]
    if not found.changed:
        parts.append("No cell regressed against the baseline.")
    parts += [details(f"What differs: {name}", text) for name, text in found.changed]
    return "\n\n".join(parts)


def render(results: str | Path, output: str | Path, *, baseline_arm: str | None = None,
           embed_images: bool = False, title: str = "Parity report",
           against: Against | None = None) -> str:
    """Writes the markdown document `output` and returns it.

    `baseline_arm`: the arm speedups and memory ratios are taken against; None picks the
    first present of `reports.baseline.PREFERENCE`. An arm with no records is a ValueError
    naming the arms present. `embed_images`: the PNGs go into the markdown as
    data:image/png;base64 URIs (a pasted document keeps them) instead of files beside it,
    linked relative to it.

    Records whose environments differ (versions, backend, device kind or count, XLA flags)
    are never compared: each environment gets its own section. `against`: the results
    compared with a baseline run's, a section at the end, with a folded "What differs"
    block under every regressed cell.
    """
    output = Path(output)
    df = to_frame(read_dir(results))
    if baseline_arm is not None:
        baseline.check(baseline_arm, df["arm"])
    groups = list(df.groupby("environment", sort=False))
    parts = [f"# {title}"]
    if len(groups) > 1:
        parts.append(f"> These results come from {len(groups)} different environments; each "
                     "has its own section and no number is compared across them.")
    with tempfile.TemporaryDirectory(prefix=".parity-report-", dir=_existing(output)) as tmp:
        staged = Path(tmp)  # every file is written here first, then moved into place
        for index, (_, group) in enumerate(groups, 1):
            prefix = f"env{index}_" if len(groups) > 1 else ""
            if len(groups) > 1:
                parts.append(f"## Environment {index}")
            planned = group["plan_target"].notna()
            timed = group[~planned].reset_index(drop=True)
            if not timed.empty:
                arm, how = _baseline(timed, baseline_arm)
                parts.append(_section(timed, staged, prefix, arm, how, embed_images,
                                      group[planned].reset_index(drop=True)))
            if planned.any():
                plans = group[planned].reset_index(drop=True)
                arm, _ = _baseline(plans, baseline_arm)
                parts.append(plan.section(
                    plans, staged, prefix, arm,
                    lambda title, path: _image(title, path, embed_images), measured=df))
        if against is not None:
            parts.append(_against(against))
        text = "\n\n".join(parts) + "\n"
        (staged / output.name).write_text(text)
        _publish(staged, output, images=not embed_images)
    return text


def _existing(output: Path) -> Path:
    """The nearest directory of `output`'s that exists (the staging directory goes there,
    on the same filesystem as the report, so that moving a file into place is a rename)."""
    directory = output.parent.absolute()
    while not directory.exists():
        directory = directory.parent
    return directory


def _publish(staged: Path, output: Path, *, images: bool) -> None:
    """Moves the staged report into place, the PNGs first and the markdown last, with
    SIGINT, SIGTERM and SIGHUP held until the last rename: a stop leaves the old report or
    the whole new one, never a new plot beside an old document (or an empty directory)."""
    import signal

    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if images:
            for png in sorted(staged.glob("*.png")):
                png.replace(output.parent / png.name)
        (staged / output.name).replace(output)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
