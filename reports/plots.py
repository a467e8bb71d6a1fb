"""PNG figures from the results DataFrame (matplotlib, Agg).

Every figure has a title (also written into the PNG's Title chunk) and units on its axes, is
saved at `DPI` (>= 100) and gives each arm the same colour in every figure. In the speedup
chart and the step-time boxes, a cell that fails gradient parity is hatched and labelled so:
its time is not comparable work. Memory is not about the work done, so it is not hatched.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.patches import Patch

from reports.tables import by_shape, fails_parity, ok, shape_label, speedup

WIDTH = 10.0
"""Figure width in inches (x DPI = pixels)."""
DPI = 110
FAIL_HATCH = "//"


def save(fig, path: Path) -> Path:
    """Writes the figure as a PNG whose `Title` text chunk is the figure's drawn title (its
    suptitle, else its first axes' title); a figure without one is an error."""
    title = fig.get_suptitle() or next((ax.get_title() for ax in fig.axes if ax.get_title()),
                                       "")
    if not title:
        plt.close(fig)
        raise ValueError(f"{path.name}: a figure needs a title")
    fig.savefig(path, dpi=DPI, bbox_inches="tight", facecolor="white",
                metadata={"Title": title})
    plt.close(fig)
    return path


def colours(df: pd.DataFrame) -> dict[str, tuple]:
    """One colour per arm, in order of first appearance (the same in every figure)."""
    palette = plt.get_cmap("tab10").colors
    return {arm: palette[i % len(palette)] for i, arm in enumerate(dict.fromkeys(df["arm"]))}


def _shapes(frame: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(shape_label(r) for _, r in frame.iterrows()))


def _cell(frame: pd.DataFrame, arm: str, label: str):
    for _, r in frame[frame["arm"] == arm].iterrows():
        if shape_label(r) == label:
            return r
    return None


def legend(ax, arms: list[str], colour: dict, any_failing: bool, extra: tuple = ()) -> None:
    """One plain patch per arm (a bar's own hatch would mislead in the legend), then `extra`
    handles and, if any bar is hatched, what the hatch means."""
    handles = [Patch(facecolor=colour[a], edgecolor="black", label=a) for a in arms]
    handles += list(extra)
    if any_failing:
        handles = [*handles, Patch(facecolor="white", edgecolor="black", hatch=FAIL_HATCH,
                                   label="gradient parity FAIL\n(not comparable work)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9,
              title="arm", title_fontsize=9)


def _mib(value: float) -> str:
    """Three significant digits, never in exponent form (83.0, 263, 1234)."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def grouped_bars(ax, frame: pd.DataFrame, arms: list[str], value, colour: dict, *,
                 fmt: Callable[[float], str], hatch_failing: bool) -> bool:
    """Bars of `value(row)` ((height, low, high) or None) per shape (groups) and arm
    (colours), each labelled with `fmt(height)`; with `hatch_failing`, the bars of
    cells failing gradient parity are hatched. Returns whether any bar was hatched."""
    shapes = _shapes(frame)
    width = 0.8 / max(1, len(arms))
    any_failing = False
    for i, arm in enumerate(arms):
        xs, heights, errors, hatched = [], [], [[], []], []
        for j, label in enumerate(shapes):
            row = _cell(frame, arm, label)
            got = value(row) if row is not None else None
            if got is None:
                continue
            height, low, high = got
            xs.append(j - 0.4 + width * (i + 0.5))
            heights.append(height)
            errors[0].append(height - low if low is not None else 0.0)
            errors[1].append(high - height if high is not None else 0.0)
            hatched.append(hatch_failing and fails_parity(row))
        if not xs:
            continue
        has_ci = any(errors[0]) or any(errors[1])
        bars = ax.bar(xs, heights, width * 0.92, color=colour[arm], edgecolor="black",
                      linewidth=0.5, label=arm, yerr=errors if has_ci else None, capsize=3,
                      error_kw={"elinewidth": 1, "ecolor": "#333333"})
        for bar, failing in zip(bars, hatched, strict=True):
            if failing:
                bar.set_hatch(FAIL_HATCH)
                any_failing = True
        # The value goes on top of a bar without a CI; with one, at the bar's foot (the
        # error bar owns the top and would cross the text).
        for x, height in zip(xs, heights, strict=True):
            ax.annotate(fmt(height), (x, 0 if has_ci else height),
                        xytext=(0, 3 if has_ci else 2), textcoords="offset points",
                        ha="center", va="bottom", fontsize=8,
                        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                              "alpha": 0.85} if has_ci else None)
    ax.set_xticks(range(len(shapes)), shapes, fontsize=9)
    ax.set_xlim(-0.5, len(shapes) - 0.5)
    return any_failing


def _mark_failing_baseline(ax, frame: pd.DataFrame, baseline_arm: str) -> None:
    """Adds '(baseline fails parity)' under each shape where the baseline is not exact."""
    labels = []
    for label in _shapes(frame):
        row = _cell(frame, baseline_arm, label)
        failing = row is not None and fails_parity(row)
        labels.append(f"{label}\n({baseline_arm} fails parity)" if failing else label)
    ax.set_xticks(range(len(labels)), labels, fontsize=9)


def speedups(df: pd.DataFrame, path: Path, baseline_arm: str) -> Path:
    """The headline: each arm's speedup vs the baseline per shape, with the 95% CI of
    reports.stats as error bars and the baseline as a line at 1.0."""
    frame = by_shape(ok(df))
    colour = colours(df)
    arms = [a for a in dict.fromkeys(frame["arm"]) if a != baseline_arm]
    fig, ax = plt.subplots(figsize=(WIDTH, 5.0))

    def value(row):
        c = speedup(frame, row, baseline_arm)
        return None if c is None else (c.ratio, c.low, c.high)

    any_failing = grouped_bars(ax, frame, arms, value, colour, fmt="{:.2f}".format,
                                hatch_failing=True)
    line = ax.axhline(1.0, color="black", linestyle="--", linewidth=1.2,
                      label=f"{baseline_arm}\n(baseline, 1.00x)")
    legend(ax, arms, colour, any_failing, (line,))
    _mark_failing_baseline(ax, frame, baseline_arm)
    ax.set_ylim(bottom=0)
    ax.set_ylabel(f"speedup vs {baseline_arm} (x; above 1 = faster)")
    ax.set_title(f"Speedup vs {baseline_arm}: median ms/step ratio with 95% CI "
                 "(reports.stats)")
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path)


def step_time_distribution(df: pd.DataFrame, path: Path) -> Path:
    """One box per arm for every shape: the untraced per-step times of every round, on a y
    axis from 0."""
    frame = by_shape(ok(df))
    colour = colours(df)
    shapes = _shapes(frame) or ["(no timed cells)"]
    ncols = min(len(shapes), 2)
    nrows = math.ceil(len(shapes) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH, 4.0 * nrows + 0.6), squeeze=False)
    for ax, label in zip(axes.flat, shapes, strict=False):
        cells = [r for _, r in frame.iterrows() if shape_label(r) == label]
        if cells:
            boxes = ax.boxplot([r["step_ms"] for r in cells], patch_artist=True,
                               tick_labels=[r["arm"] + ("\n(parity FAIL)" if fails_parity(r)
                                                        else "") for r in cells],
                               medianprops={"color": "black"}, flierprops={"markersize": 3})
            for box, r in zip(boxes["boxes"], cells, strict=True):
                box.set_facecolor(colour[r["arm"]])
                box.set_alpha(0.8)
                if fails_parity(r):
                    box.set_hatch(FAIL_HATCH)
        ax.set_title(label, fontsize=10)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
        for tick in ax.get_xticklabels():
            tick.set_horizontalalignment("right")
        ax.set_ylim(bottom=0)
        ax.set_ylabel("ms / step")
        ax.grid(axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(shapes):]:
        ax.set_visible(False)
    fig.suptitle("Step-time distribution (untraced; every timed step of every round)")
    fig.tight_layout()
    return save(fig, path)


def sweep(df: pd.DataFrame, path: Path) -> Path | None:
    """Median ms/step against sequence length: one line per arm (its colour) and GA (solid
    at GA 1, dashed above). None when there is only one sequence length to plot."""
    frame = ok(df)
    if frame["seq"].nunique() < 2:
        return None
    colour = colours(df)
    fig, ax = plt.subplots(figsize=(WIDTH, 5.0))
    for (arm, ga), cells in frame.groupby(["arm", "ga"], sort=False):
        cells = cells.sort_values("seq")
        ax.plot(cells["seq"], cells["median_ms"], marker="o", color=colour[arm],
                linestyle="-" if ga == 1 else "--", label=f"{arm} ga{ga}")
    ax.set_xticks(sorted(frame["seq"].unique()))
    ax.set_ylim(bottom=0)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("median ms / step")
    ax.set_title("Median step time vs sequence length (solid GA 1, dashed GA > 1)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    ax.grid(alpha=0.3)
    return save(fig, path)


def memory_bars(df: pd.DataFrame, path: Path) -> Path:
    """Planned peak bytes (over the executables a step calls, argument + output - alias +
    temp and the train state held beside it) per shape and arm, and the measured peak
    beside it where the backend reports one."""
    frame = by_shape(ok(df))
    colour = colours(df)
    arms = list(dict.fromkeys(frame["arm"]))
    panels = [("planned_bytes", "Planned peak: an executable (argument + output - alias + "
                                "temp) + the state held beside it")]
    if frame["peak_bytes"].notna().any():
        panels.append(("peak_bytes", "Measured: memory_stats peak_bytes_in_use"))
    fig, axes = plt.subplots(len(panels), 1, figsize=(WIDTH, 4.5 * len(panels)), squeeze=False)
    for ax, (column, title) in zip(axes[:, 0], panels, strict=True):
        def value(row, column=column):
            v = row[column]
            return None if v is None or pd.isna(v) else (float(v) / 2**20, None, None)

        grouped_bars(ax, frame, arms, value, colour, fmt=_mib, hatch_failing=False)
        ax.set_ylabel("MiB per device")
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    legend(axes[0, 0], arms, colour, any_failing=False)
    fig.suptitle("Memory per arm and shape (MiB)")
    fig.tight_layout()
    return save(fig, path)

