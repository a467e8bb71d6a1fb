"""Markdown tables from the results DataFrame (pure functions: frame in, text out)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from reports import stats
from reports.record import ExecutableMemory

SHAPE = ["preset", "seq", "batch", "ga", "mesh", "dtype"]
NATIVE = "native"


def markdown(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _f(value, spec=".1f", missing="-") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return missing
    return format(value, spec)


def _bytes(value) -> str:
    if value is None or pd.isna(value):
        return "-"
    return f"{value / 2**20:.1f} MiB"


def shape_label(row) -> str:
    mesh = "" if row["mesh"] in ("1", "", None) else f" mesh {row['mesh']}"
    return f"{row['preset']} s{row['seq']} b{row['batch']} ga{row['ga']}{mesh} {row['dtype']}"


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def _arm_label(arm: str, about: str) -> str:
    return f"{arm} ({about})" if about else arm


def setup(df: pd.DataFrame) -> str:
    ok_rows = ok(df)
    shas = sorted({f"{s[:10]}{' (dirty)' if d else ''}" for s, d in
                   zip(df["git_sha"].fillna("?"), df["git_dirty"], strict=True)})
    rows = [
        ("environment", df["environment"].iloc[0]),
        ("git", ", ".join(shas)),
        ("runs", ", ".join(sorted(df["run_id"].dropna().unique()))),
        ("arms", ", ".join(_arm_label(arm, about) for arm, about in dict.fromkeys(
            zip(df["arm"], df["about"].fillna(""), strict=True)))),
        ("presets", ", ".join(dict.fromkeys(df["preset"]))),
        ("shapes (seq x batch, GA)", ", ".join(
            f"{s}x{b} ga{g}" for s, b, g in dict.fromkeys(zip(
                df["seq"], df["batch"], df["ga"], strict=True)))),
        ("mesh", ", ".join(dict.fromkeys(df["mesh"]))),
        ("dtype", ", ".join(dict.fromkeys(df["dtype"]))),
        ("steps / warmup", ", ".join(f"{s} / {w}" for s, w in dict.fromkeys(zip(
            ok_rows["steps"], ok_rows["warmup"], strict=True)))),
        ("timing", "untraced; every step blocked on its outputs; traces (where taken) come "
                   "from a separate window after timing"),
    ]
    return markdown(["setup", "value"], rows)


def _speedup(df: pd.DataFrame, row, other_arm: str) -> tuple[str, str]:
    """(median(other)/median(arm) as "1.23x", noise verdict) for the same shape."""
    same = df[(df["arm"] == other_arm)]
    for col in SHAPE:
        same = same[same[col] == row[col]]
    if same.empty or row["arm"] == other_arm:
        return ("1.00x" if row["arm"] == other_arm else "-"), ""
    other = same.iloc[0]
    if len(other["step_ms"]) < 2 or len(row["step_ms"]) < 2:
        return f"{other['median_ms'] / row['median_ms']:.2f}x", "?"
    ci = stats.ratio_of_medians(row["step_ms"], other["step_ms"])
    verdict = "within noise" if not ci.excludes_one else "significant"
    return f"{ci.ratio:.2f}x [{ci.low:.2f}, {ci.high:.2f}]", verdict


def timing(df: pd.DataFrame, baseline_arm: str) -> str:
    rows = []
    for _, r in ok(df).iterrows():
        vs_base, base_noise = _speedup(ok(df), r, baseline_arm)
        vs_native, _ = _speedup(ok(df), r, NATIVE)
        rows.append((shape_label(r), r["arm"], _f(r["median_ms"]), _f(r["mean_ms"]),
                     _f(r["max_ms"]), _f(r["tokens_per_s"], ".0f"), vs_base, base_noise,
                     vs_native))
    return markdown(["shape", "arm", "median ms", "mean ms", "max ms", "tok/s",
                     f"speedup vs {baseline_arm} [95% CI]", "vs baseline", "speedup vs native"],
                    rows)


def memory(df: pd.DataFrame, baseline_arm: str) -> str:
    rows = []
    frame = ok(df)
    for _, r in frame.iterrows():
        base = frame[(frame["arm"] == baseline_arm)]
        for col in SHAPE:
            base = base[base[col] == r[col]]
        ratio = (f"{r['planned_bytes'] / base.iloc[0]['planned_bytes']:.2f}x"
                 if not base.empty and r["planned_bytes"] and base.iloc[0]["planned_bytes"]
                 else "-")
        measured = _bytes(r["peak_bytes"]) if r["peak_bytes"] is not None and not pd.isna(
            r["peak_bytes"]) else "n/a (backend has no memory_stats)"
        rows.append((shape_label(r), r["arm"], measured, _bytes(r["planned_bytes"]), ratio,
                     _bytes(r["rss_delta_bytes"])))
    return markdown(["shape", "arm", "peak measured", "planned (largest executable)",
                     f"planned vs {baseline_arm}", "RSS high-water delta"], rows)


def executables(df: pd.DataFrame) -> str:
    """Every executable of every cell: calls per step and each field XLA's memory_analysis
    gives (a field added to `ExecutableMemory` appears here with no other change)."""
    fields = [f.name for f in dataclasses.fields(ExecutableMemory)]
    rows = []
    for _, r in ok(df).iterrows():
        for name, planned in r["executables"].items():
            values = [_bytes(getattr(planned, f)) if planned else "-" for f in fields]
            rows.append((shape_label(r), r["arm"], name,
                         _f(r["calls_per_step"].get(name), "d"), *values))
    return markdown(["shape", "arm", "executable", "calls/step", *fields], rows)


def parity(df: pd.DataFrame) -> str:
    rows = []
    for _, r in ok(df).iterrows():
        dens = "/".join(f"{d:g}" for d in r["denominators"]) if r["denominators"] else "-"
        rows.append((shape_label(r), r["arm"], dens, _f(r["denominator"], "g"),
                     _f(r["loss"], ".6f"), _f(r["exact_loss"], ".6f"), _f(r["grad_l2"], ".5f"),
                     _f(r["rel_l2"], ".2e"), (r["data_digest"] or "-")[:12]))
    return markdown(["shape", "arm", "micro-batch denominators", "sum", "loss (trainer)",
                     "exact loss", "gradient L2", "rel_l2 vs exact", "data"], rows)


def traced(df: pd.DataFrame) -> str:
    rows = []
    for _, r in ok(df).iterrows():
        rows.append((shape_label(r), r["arm"], _f(r["trace_executions"], ".0f"),
                     _f(r["trace_step_ms"]), _f(r["trace_busy_ms"]), _f(r["trace_host_ms"]),
                     _f(r["dispatch_ms"], ".2f"), f"{_f(r['gc_count'], '.0f')} / "
                     f"{_f(r['gc_ms'], '.1f')} ms", _f(r["recompiles"], ".0f")))
    return markdown(["shape", "arm", "executions/step (trace)", "traced ms/step",
                     "busy ms (trace)", "host ms (trace)", "dispatch ms (untraced)",
                     "GC pauses (untraced)", "recompiles after warmup"], rows)


def noise(df: pd.DataFrame, baseline_arm: str) -> str:
    frame = ok(df)
    rows = [(shape_label(r), r["arm"], _f(r["cv"], ".3f"), len(r["step_ms"]))
            for _, r in frame.iterrows()]
    within = []
    for _, r in frame.iterrows():
        ratio, verdict = _speedup(frame, r, baseline_arm)
        if verdict == "within noise":
            within.append(f"- {shape_label(r)}: {r['arm']} vs {baseline_arm} {ratio} "
                          "(the 95% CI includes 1.00x)")
    text = markdown(["shape", "arm", "CV (stdev/mean)", "timed steps"], rows)
    text += "\n\nDifferences within noise:\n" + ("\n".join(within) if within else "- none")
    recompiled = [f"- {shape_label(r)}: {r['arm']} compiled {r['recompiles']:.0f} more time(s)"
                  for _, r in frame.iterrows() if r["recompiles"]]
    text += ("\n\nCells that compiled after warmup (their timings include compilation; a "
             "trainer that recompiles mid-run):\n" + ("\n".join(recompiled) or "- none"))
    return text


def failures(df: pd.DataFrame) -> str:
    bad = df[df["status"] != "ok"]
    if bad.empty:
        return "No failed cells."
    rows = [(shape_label(r), r["arm"], r["error_reason"],
             str(r["error_message"]).replace("|", "\\|").replace("\n", " ")[:200])
            for _, r in bad.iterrows()]
    return markdown(["shape", "arm", "reason", "message"], rows)
