"""The report's "Plan on <target>" section: every arm's plan of a shape side by side.

A plan is XLA:TPU's static buffer assignment and cost model for the target, compiled on a
machine without its chips (`parity plan`): an upper bound on peak HBM and the compiler's
traffic and collective figures, exact for given code and versions, for comparing arms and
commits. No figure here was measured.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.lines import Line2D

from reports.plots import WIDTH, colours, grouped_bars, legend, save
from reports.tables import MISSING, by_shape, markdown, ok, same_shape, shape_label

KINDS = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
SHORT = {"all-gather": "AG", "reduce-scatter": "RS", "all-reduce": "AR", "all-to-all": "A2A",
         "collective-permute": "CP"}

EXPLAINED = (
    "XLA:TPU's own plan of each arm's step for the target, compiled here from shapes alone "
    "(`parity plan`; no chip, nothing run): the compiler's buffer assignment and cost "
    "model, an upper bound on peak HBM, not a measurement. Per device. **Planned peak** = "
    "the largest, over the executables a step runs, of argument + output + temp - alias, "
    "plus the train state that stays in HBM without being that executable's argument (the "
    "optimizer state during a split fwd/bwd); XLA's own peak_memory_in_bytes + the same "
    "state beside it. **Resident**: params / optimizer state (PeftTrainer's includes its "
    "MultiSteps accumulator) / separate accumulator. **HBM**: bytes each top-level "
    "instruction reads and writes in HBM, loops counted as they run. **Collectives**: bytes "
    "per kind, what each device sends as ring algorithms move it over n devices (AG "
    "all-gather: (n-1)/n of the gathered result; RS reduce-scatter, A2A all-to-all: (n-1)/n "
    "of the operand; AR all-reduce: twice that; CP collective-permute: the operand). **FLOPs**: "
    "matmul FLOPs per device, remat recompute included. Ratios are to the baseline arm.")


def _gib(value, digits: int = 3) -> str:
    return MISSING if value is None or pd.isna(value) else f"{value / 2**30:.{digits}f}"


def _ratio(value, base) -> str:
    if value is None or base is None or pd.isna(value) or pd.isna(base) or not base:
        return ""
    return f" ({value / base:.2f}x)"


def _resident(row) -> str:
    parts = row["plan_resident"] or {}
    shown = [f"{parts[p] / 2**30:.4f}" for p in ("params", "opt_state") if p in parts]
    shown.append(f"{parts['accumulator'] / 2**30:.4f}" if "accumulator" in parts else "-")
    return " / ".join(shown)


def _collectives(row) -> str:
    found = row["plan_collectives"] or {}
    return ", ".join(f"{SHORT[k]} {found[k] / 2**30:.3f}" for k in KINDS if found.get(k)) or "0"


def table(df: pd.DataFrame, baseline_arm: str) -> str:
    rows = []
    frame = by_shape(df)
    for _, r in frame.iterrows():
        if r["status"] != "ok":
            rows.append((shape_label(r), r["arm"], f"**{r['error_reason']}**: "
                         f"{str(r['error_message'])[:160]}", *[MISSING] * 7))
            continue
        base = same_shape(ok(frame), r, baseline_arm)
        b = base.iloc[0] if not base.empty else None

        def vs(column, row=r, b=b):
            return _ratio(row[column], None if b is None else b[column])

        capacity = r["plan_capacity"]
        fits = ("" if r["plan_fits"] is None or pd.isna(r["plan_fits"])
                else " fits" if r["plan_fits"] else " **DOES NOT FIT**")
        rows.append((
            shape_label(r), r["arm"],
            f"{_gib(r['plan_peak'], 4)}{vs('plan_peak')} of {_gib(capacity, 2)}{fits}",
            f"{_gib(r['plan_xla_peak'], 4)}", r["plan_peak_executable"], _resident(r),
            f"{_gib(r['plan_hbm_per_step'])}{vs('plan_hbm_per_step')}",
            f"{_collectives(r)}{vs('plan_collective_bytes')}",
            (f"{r['plan_flops_per_step'] / 1e12:.3f}{vs('plan_flops_per_step')}"
             if r["plan_flops_per_step"] is not None and not pd.isna(r["plan_flops_per_step"])
             else MISSING),
            f"{r['plan_compile_s']:.0f}"))
    return markdown(["shape", "arm", "planned peak GiB (vs baseline) of capacity",
                     "XLA peak GiB", "peak in", "resident GiB params / opt / acc",
                     "HBM GiB/step", "collective GiB/step", "TFLOP/step", "compile s"],
                    rows, why={"TFLOP/step": "a loop of unreadable length in every plan"})


def peak_bars(df: pd.DataFrame, path: Path) -> Path:
    """Planned peak per device per shape and arm, with the device's HBM as a line."""
    frame = by_shape(ok(df))
    colour = colours(df)
    arms = list(dict.fromkeys(frame["arm"]))
    fig, ax = plt.subplots(figsize=(WIDTH, 4.8))

    def value(row):
        v = row["plan_peak"]
        return None if v is None or pd.isna(v) else (float(v) / 2**30, None, None)

    grouped_bars(ax, frame, arms, value, colour, fmt=lambda v: f"{v:.2f}",
                 hatch_failing=False)
    extra = ()
    capacity = frame["plan_capacity"].dropna()
    if not capacity.empty:
        line = float(capacity.iloc[0]) / 2**30
        tallest = max((v for v in frame["plan_peak"].dropna()), default=0) / 2**30
        if line <= 4 * max(tallest, 1e-9):  # drawn where it does not flatten every bar
            ax.axhline(line, color="red", linestyle="--", linewidth=1.2)
        extra = (Line2D([], [], color="red", linestyle="--",
                        label=f"HBM per device {line:.1f} GiB"
                        + ("" if line <= 4 * max(tallest, 1e-9) else " (off scale)")),)
    ax.set_ylabel("GiB per device")
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    legend(ax, arms, colour, any_failing=False, extra=extra)
    target = frame["plan_target"].iloc[0] if len(frame) else "?"
    ax.set_title(f"Planned peak HBM per device on {target} (XLA's plan, not a measurement)")
    fig.tight_layout()
    return save(fig, path)


def section(df: pd.DataFrame, image_dir: Path, prefix: str, baseline_arm: str,
            image) -> str:
    """The markdown of every target's plans in `df` (rows with a plan_target)."""
    parts = []
    for index, (name, group) in enumerate(df.groupby("plan_target", sort=False)):
        group = group.reset_index(drop=True)
        kinds = ", ".join(dict.fromkeys(group["plan_device_kind"].dropna()))
        libtpu = ", ".join(dict.fromkeys(group["plan_libtpu"].dropna()))
        parts += [f"### Plan on {name}",
                  f"{kinds} devices; libtpu {libtpu}; baseline {baseline_arm}. {EXPLAINED}",
                  table(group, baseline_arm)]
        if not ok(group).empty:
            png = peak_bars(group, image_dir / f"{prefix}plan{index}_peak.png")
            parts.append(image(f"Planned peak on {name}", png))
    return "\n\n".join(parts)
