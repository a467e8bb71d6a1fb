"""PNG figures from the results DataFrame (matplotlib, Agg; fixed sizes and dpi)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reports.tables import ok

SIZE = (10.0, 5.0)
DPI = 80
"""Every figure is SIZE x DPI = 800 x 400 pixels."""


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _shapes(frame: pd.DataFrame) -> list[tuple]:
    return list(dict.fromkeys(zip(frame["preset"], frame["seq"], frame["batch"], frame["ga"],
                                  strict=True)))


def step_time_distribution(df: pd.DataFrame, path: Path) -> Path:
    """One box per arm for every shape: the untraced per-step times."""
    frame = ok(df)
    shapes = _shapes(frame)
    fig, axes = plt.subplots(1, max(1, len(shapes)), figsize=SIZE, dpi=DPI, squeeze=False)
    for ax, (preset, seq, batch, ga) in zip(axes[0], shapes, strict=False):
        cells = frame[(frame["preset"] == preset) & (frame["seq"] == seq)
                      & (frame["batch"] == batch) & (frame["ga"] == ga)]
        ax.boxplot(list(cells["step_ms"]), tick_labels=list(cells["arm"]))
        ax.set_title(f"{preset} s{seq} b{batch} ga{ga}", fontsize=8)
        ax.tick_params(axis="x", labelrotation=60, labelsize=7)
        ax.set_ylabel("ms / step")
    return _save(fig, path)


def sweep(df: pd.DataFrame, path: Path) -> Path:
    """Median ms/step against sequence length: one line per arm and GA."""
    frame = ok(df)
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    for (arm, ga), cells in frame.groupby(["arm", "ga"], sort=False):
        cells = cells.sort_values("seq")
        ax.plot(cells["seq"], cells["median_ms"], marker="o",
                linestyle="-" if ga == 1 else "--", label=f"{arm} ga{ga}")
    ax.set_xlabel("sequence length")
    ax.set_ylabel("median ms / step")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def memory_bars(df: pd.DataFrame, path: Path) -> Path:
    """Planned bytes (largest executable's argument + output - alias + temp) per cell."""
    frame = ok(df)
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    labels = [f"{r.arm}\ns{r.seq} ga{r.ga}" for r in frame.itertuples()]
    ax.bar(range(len(frame)), frame["planned_bytes"].fillna(0) / 2**20)
    ax.set_xticks(range(len(frame)), labels, fontsize=6, rotation=90)
    ax.set_ylabel("planned MiB")
    return _save(fig, path)
