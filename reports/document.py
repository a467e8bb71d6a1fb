"""The parity document: markdown sections and PNGs beside it, per comparable environment."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from reports import plots, stats, tables
from reports.records import read_dir, to_frame


def _section(df: pd.DataFrame, out_dir: Path, prefix: str, baseline_arm: str) -> str:
    figures = {
        "Step-time distribution": plots.step_time_distribution(
            df, out_dir / f"{prefix}step_times.png"),
        "ms/step vs sequence length": plots.sweep(df, out_dir / f"{prefix}sweep.png"),
        "Planned memory": plots.memory_bars(df, out_dir / f"{prefix}memory.png"),
    }
    parts = [
        "### Setup", tables.setup(df),
        "### ms/step", "Untraced timing; each round is a separate process, rounds interleave "
        "the arms (A B C, C B A, ...). Median = median of the rounds' medians, with a 95% "
        "bootstrap CI over rounds. Speedup = median(other) / median(arm): above 1.00x the arm "
        "is faster; its bracket is the 95% CI of reports.stats (bootstrap over rounds, then "
        f"steps) and a verdict needs a {stats.MIN_EFFECT:.0%}+ difference and enough rounds "
        "for 95% to be reachable (4+ a side; interleaved rounds count as pairs from "
        f"{stats.MIN_PAIRS}).",
        tables.timing(df, baseline_arm),
        "### Cost per step", "Model FLOPs: one formula for every arm (MaxText's: 6 x matmul "
        "params x tokens + causal attention; remat recompute excluded). Compiled FLOPs and "
        "bytes: XLA's cost model of every executable x its calls per step, each while-loop "
        "body counted as many times as it runs. All are exact (no timing noise).",
        tables.cost(df),
        "### Peak memory", tables.memory(df, baseline_arm),
        "### Executables", "XLA's memory_analysis of each compiled executable (per device); "
        "calls/step weights the per-step cost.", tables.executables(df),
        "### Gradient parity", "rel_l2 = ||g - g_exact|| / ||g_exact||, where g is the gradient "
        "the optimizer saw at step 1 and g_exact = sum_i grad(loss_sum_i) / sum_i den_i.",
        tables.parity(df),
        "### Executions, host and device time (traced window)", "From the separate traced "
        "window; these numbers never mix with the untraced timing above.", tables.traced(df),
        "### Noise", tables.noise(df, baseline_arm),
        "### Failed cells", tables.failures(df),
        "### Plots",
    ]
    parts += [f"![{title}]({path.name})" for title, path in figures.items()]
    return "\n\n".join(parts)


def render(results: str | Path, output: str | Path, *, baseline_arm: str = "peft-decoder",
           title: str = "Parity report") -> str:
    """Writes the markdown document `output` and its PNGs beside it; returns the markdown.

    Records whose environments differ (versions, backend, device kind or count, XLA flags)
    are never compared: each environment gets its own section.
    """
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    df = to_frame(read_dir(results))
    if baseline_arm not in set(df["arm"]):
        raise ValueError(f"baseline arm {baseline_arm!r} has no records here; arms present: "
                         f"{', '.join(dict.fromkeys(df['arm']))}")
    groups = list(df.groupby("environment", sort=False))
    parts = [f"# {title}"]
    if len(groups) > 1:
        parts.append(f"> These results come from {len(groups)} different environments; each "
                     "has its own section and no number is compared across them.")
    for index, (_, group) in enumerate(groups, 1):
        prefix = f"env{index}_" if len(groups) > 1 else ""
        if len(groups) > 1:
            parts.append(f"## Environment {index}")
        parts.append(_section(group.reset_index(drop=True), output.parent, prefix,
                              baseline_arm))
    text = "\n\n".join(parts) + "\n"
    output.write_text(text)
    return text
