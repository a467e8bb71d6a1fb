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
from reports.tables import (
    MISSING,
    arm_label,
    by_shape,
    markdown,
    ok,
    same_shape,
    shape_label,
)

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
            rows.append((shape_label(r), arm_label(r), f"**{r['error_reason']}**: "
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
            shape_label(r), arm_label(r),
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


ROOFLINE = (
    "**Roofline**: the least time a step of this program can take on the target, from the "
    "plan's figures against the device's datasheet (per device; not a measurement). Per "
    "call of each executable: compute = matmul FLOPs / peak FLOP/s for the cell's dtype, "
    "memory = HBM bytes / HBM bandwidth, collectives = the bytes a device sends under ring "
    "algorithms / its share of the chip's bidirectional interconnect; the call's bound is "
    "the largest of the three (they may overlap, at best entirely); a step's bound is "
    "calls x that, summed over its executables, and **bound by** is what sets most of it. "
    "**MFU ceiling** = the step's model FLOPs at peak / the bound: the MFU no run of this "
    "program can exceed. **Measured**: the median ms/step of the same cell run on that "
    "device kind, where such records are given, and measured / bound.")


def _ms(value, digits: int = 2) -> str:
    return MISSING if value is None or pd.isna(value) else f"{value * 1e3:.{digits}f}"


def measured_on(plan_row, measured: pd.DataFrame | None):
    """The median ms/step of the plan's cell measured on the plan's device kind (the same
    arm and work: config hash), the latest run's; None where there is none."""
    if measured is None or measured.empty or "device_kind" not in measured:
        return None
    same = measured[(measured["plan_target"].isna()) & (measured["status"] == "ok")
                    & (measured["arm"] == plan_row["arm"])
                    & (measured["config_hash"] == plan_row["config_hash"])
                    & (measured["device_kind"] == plan_row["plan_device_kind"])
                    & measured["median_ms"].notna()]
    return None if same.empty else float(same.sort_values("run_id")["median_ms"].iloc[-1])


def roofline_table(df: pd.DataFrame, measured: pd.DataFrame | None = None) -> str:
    """Per cell: the roofline's times per step, the bound, what sets it, the MFU ceiling and
    (where given) the measured step beside it."""
    rows = []
    for _, r in by_shape(ok(df)).iterrows():
        bound = r["plan_bound_s"]
        if bound is None or pd.isna(bound):
            rows.append((shape_label(r), arm_label(r), *[MISSING] * 9))
            continue
        ms = measured_on(r, measured)
        rows.append((
            shape_label(r), arm_label(r), _ms(r["plan_compute_s"]), _ms(r["plan_memory_s"]),
            _ms(r["plan_collective_s"]), f"**{_ms(bound)}**", r["plan_bound_by"],
            _ms(r["plan_model_s"]), f"{r['plan_mfu_ceiling']:.1%}",
            MISSING if ms is None else f"{ms:.2f}",
            MISSING if ms is None else f"{ms / (bound * 1e3):.2f}x"))
    return markdown(["shape", "arm", "compute ms", "memory ms", "collectives ms",
                     "lower bound ms/step", "bound by", "model FLOPs at peak ms",
                     "MFU ceiling", "measured ms/step", "measured / bound"], rows,
                    why={"lower bound ms/step": "no datasheet for the device kind, or a "
                                                "figure of the plan unavailable",
                         "measured ms/step": "no record of these cells run on the target's "
                                             "device kind among the results given",
                         "measured / bound": "nothing measured to compare"})


def datasheets(df: pd.DataFrame) -> str:
    """The datasheet figures the rooflines of `df` use, with their sources."""
    lines = []
    sheets = {(s.device_kind, s.matmul_dtype): s for s in df.get("plan_datasheet", [])
              if s is not None}
    for sheet in sheets.values():
        link = (f"{sheet.interconnect_bytes_per_s / 1e9:g} GB/s interconnect"
                if sheet.interconnect_bytes_per_s else "no interconnect figure")
        lines.append(f"- {sheet.device_kind}, {sheet.matmul_dtype} matmuls, per device: "
                     f"{sheet.peak_flops / 1e12:g} TFLOP/s, {sheet.hbm_bytes_per_s / 1e9:g} "
                     f"GB/s HBM, {link} (source: {sheet.source})")
    return "\n".join(lines)


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
            image, measured: pd.DataFrame | None = None) -> str:
    """The markdown of every target's plans in `df` (rows with a plan_target); `measured`:
    records of any environment whose runs on a plan's device kind go beside its roofline."""
    parts = []
    for index, (name, group) in enumerate(df.groupby("plan_target", sort=False)):
        group = group.reset_index(drop=True)
        kinds = ", ".join(dict.fromkeys(group["plan_device_kind"].dropna()))
        libtpu = ", ".join(dict.fromkeys(group["plan_libtpu"].dropna()))
        parts += [f"### Plan on {name}",
                  f"{kinds} devices; libtpu {libtpu}; baseline {baseline_arm}. {EXPLAINED}",
                  table(group, baseline_arm)]
        if group.get("plan_bound_s") is not None and group["plan_bound_s"].notna().any():
            parts += [f"#### Roofline on {name}", f"{ROOFLINE}\n\n{datasheets(group)}",
                      roofline_table(group, measured)]
        if not ok(group).empty:
            png = peak_bars(group, image_dir / f"{prefix}plan{index}_peak.png")
            parts.append(image(f"Planned peak on {name}", png))
    return "\n\n".join(parts)
