"""Planned vs measured: each timed cell that carries a plan of its own program for its device
(a run on an accelerator: its fit check's plan, harness.cell.fit), the plan's figures beside
what the cell measured.

Memory. XLA plans a step's peak as its largest executable's arguments + outputs - aliases +
temporaries, plus the train state held outside them. A TPU runtime keeps the two parts apart:
arrays are counted in `peak_bytes_in_use`, and a program's temporaries are reserved when it
is loaded, counted in `peak_bytes_reserved` and not in `peak_bytes_in_use`. The measured peak
here is their sum, an upper bound of the device's high-water mark: the two peaks may fall at
different times (an array alive only while the model is built counts in the first, not
beside the second). A backend that states no reservation (CPU, GPU) gives no sum. Where the
record read the devices after the build too (`memory.device_stats_after`), it says where
the peak in use was reached: a peak the build had already reached, and no step raised, is
the build's, so its sum with the step's reservation is not a reading of the step and is
never marked a gap.

Time. The roofline is the plan's lower bound of a step on the chip's datasheet
(harness.measure.roofline: FLOPs at the bf16 peak, HBM bytes at its bandwidth, collective
bytes at its interconnect, each executable bound by the slowest of the three). Measured /
roofline is how far the step runs from that bound; MFU is model FLOPs per second over the
bf16 peak.

A planned / measured peak more than 5% from 1 (`GAP`) is marked **gap**: a difference the
two figures' definitions do not explain, left for a person to explain by buffer."""

from __future__ import annotations

import pandas as pd

from reports.tables import MISSING, arm_label, by_shape, markdown, number, ok, shape_label

SITE_NOTE = ("The latest run's cells on their accelerator against the plan their fit check "
             "made of the same program there: peak in use + peak reserved (an upper bound of "
             "the device's high-water mark) against the planned peak, a ratio more than 5% "
             "from 1 marked gap; ms/step against the plan's roofline; MFU.")

GAP = 0.05
"""|planned / measured - 1| above which a peak's difference is printed as a gap."""


def _gib(value: float | None) -> str:
    return MISSING if value is None else f"{value / 2**30:.3f}"


def measured_peak(row) -> float | None:
    """peak in use + peak reserved (bytes), None where either is not known."""
    in_use, reserved = number(row["peak_bytes"]), number(row.get("peak_reserved"))
    return None if in_use is None or reserved is None else in_use + reserved


def _ratio(planned: float | None, measured: float | None, peak_at: str | None = None) -> str:
    if planned is None or not measured:
        return MISSING
    ratio = planned / measured
    if peak_at == "build":
        return f"{ratio:.3f} (the build's peak)"
    return f"{ratio:.3f}" + (" **gap**" if abs(ratio - 1) > GAP else "")


HEADER = ("shape", "arm", "plan for", "peak in use GiB", "peak reserved GiB",
          "in use + reserved GiB", "planned peak GiB", "planned / measured", "ms/step",
          "roofline ms/step", "bound by", "measured / roofline", "MFU")


def rows(df: pd.DataFrame) -> list[tuple[str, ...]]:
    """One row of `HEADER` per timed cell with a plan of its own, by shape."""
    cells = by_shape(ok(df))
    if "plan_peak" not in cells:
        return []
    found = []
    for _, r in cells[cells["plan_peak"].notna()].iterrows():
        planned, measured = number(r["plan_peak"]), measured_peak(r)
        bound_s, median = number(r.get("plan_bound_s")), number(r["median_ms"])
        mfu = number(r.get("mfu"))
        found.append((
            shape_label(r), arm_label(r), r.get("plan_for") or MISSING,
            _gib(number(r["peak_bytes"])), _gib(number(r.get("peak_reserved"))), _gib(measured),
            _gib(planned), _ratio(planned, measured, r.get("peak_at")),
            MISSING if median is None else f"{median:.1f}",
            MISSING if bound_s is None else f"{bound_s * 1e3:.1f}",
            r.get("plan_bound_by") or MISSING,
            MISSING if not (bound_s and median) else f"{median / (bound_s * 1e3):.2f}",
            MISSING if mfu is None else f"{mfu:.1%}"))
    return found


def planned_vs_measured(df: pd.DataFrame) -> str:
    """The markdown table of `rows`; '' where no cell has a plan of its own."""
    found = rows(df)
    return markdown(list(HEADER), found) if found else ""
