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


def _same_shape(df: pd.DataFrame, row, arm: str) -> pd.DataFrame:
    same = df[df["arm"] == arm]
    for col in SHAPE:
        same = same[same[col] == row[col]]
    return same


ARM_VIEW = {stats.SLOWER: "faster", stats.FASTER: "slower", stats.SAME: "within noise",
            stats.TOO_FEW: "too few samples"}
"""stats.verdict of (old = the arm, new = the other arm), said from the arm's side."""


def _speedup(df: pd.DataFrame, row, other_arm: str) -> tuple[str, str]:
    """(median(other)/median(arm) as "1.23x [CI]", verdict) for the same shape, by the one
    statistics rule (reports.stats); rounds that ran interleaved are compared as pairs."""
    if row["arm"] == other_arm:
        return "1.00x", ""
    same = _same_shape(df, row, other_arm)
    if same.empty:
        return "-", ""
    other = same.iloc[0]
    # Rounds of one run ran interleaved (this arm's round r next to the other's): pairs.
    paired = [run for run, _ in other["round_ids"]] == [run for run, _ in row["round_ids"]]
    c = stats.compare(row["runs"], other["runs"], paired=paired)
    return f"{c.ratio:.2f}x [{c.low:.2f}, {c.high:.2f}]", ARM_VIEW[stats.verdict(c)]


def _median_ci(r) -> str:
    if r["median_low"] is None or pd.isna(r["median_low"]):
        return _f(r["median_ms"])
    return f"{r['median_ms']:.1f} [{r['median_low']:.1f}, {r['median_high']:.1f}]"


def timing(df: pd.DataFrame, baseline_arm: str) -> str:
    rows = []
    for _, r in ok(df).iterrows():
        vs_base, base_noise = _speedup(ok(df), r, baseline_arm)
        vs_native, _ = _speedup(ok(df), r, NATIVE)
        rows.append((shape_label(r), r["arm"], r["rounds"], _median_ci(r), _f(r["mean_ms"]),
                     _f(r["max_ms"]), _f(r["tokens_per_s"], ".0f"), vs_base, base_noise,
                     vs_native))
    return markdown(["shape", "arm", "rounds", "median ms [95% CI over rounds]", "mean ms",
                     "max ms", "tok/s", f"speedup vs {baseline_arm} [95% CI]", "vs baseline",
                     "speedup vs native"], rows)


def _gflop(value) -> str:
    return _f(None if value is None or pd.isna(value) else value / 1e9, ".4g")


def cost(df: pd.DataFrame) -> str:
    """Model FLOPs (one formula for every arm), compiled FLOPs and bytes (XLA, loop-aware)."""
    rows = []
    for _, r in ok(df).iterrows():
        model, compiled = r["model_flops_per_step"], r["compiled_flops_per_step"]
        ratio = (f"{compiled * r['device_count'] / model:.2f}"
                 if model and compiled and not pd.isna(compiled) and r["device_count"]
                 else "-")
        rows.append((shape_label(r), r["arm"], _gflop(model), _gflop(compiled), ratio,
                     _bytes(r["bytes_accessed_per_step"]),
                     _f(None if r["model_flops_per_s"] is None
                        else r["model_flops_per_s"] / 1e12, ".4f"),
                     _f(r["mfu"], ".1%", "- (peak unknown)"),
                     _f(r["executions_per_step"], ".0f"), _f(r["compiles"], ".0f")))
    unavailable = [f"- {shape_label(r)} {r['arm']}: {r['cost_unavailable']}"
                   for _, r in ok(df).iterrows() if r["cost_unavailable"]]
    text = markdown(["shape", "arm", "model GFLOP/step", "compiled GFLOP/step per device",
                     "compiled x devices / model", "bytes accessed/step", "model TFLOP/s", "MFU",
                     "executions/step", "compiles"], rows)
    if unavailable:
        text += "\n\nCompiled cost unavailable:\n" + "\n".join(unavailable)
    return text


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
    rows = [(shape_label(r), r["arm"], r["rounds"], _f(r["cv"], ".3f"), len(r["step_ms"]),
             "; ".join(r["warnings"]) or "-") for _, r in frame.iterrows()]
    within = []
    for _, r in frame.iterrows():
        ratio, verdict = _speedup(frame, r, baseline_arm)
        if verdict in ("within noise", "too few samples"):
            within.append(f"- {shape_label(r)}: {r['arm']} vs {baseline_arm} {ratio}: "
                          f"{verdict}")
    text = markdown(["shape", "arm", "rounds", "worst CV in a round", "timed steps",
                     "instability"], rows)
    text += ("\n\nNo verdict (CI includes 1.00x, the difference is under "
             f"{stats.MIN_EFFECT:.0%}, or too few rounds of {stats.MIN_STEPS}+ steps for 95% to "
             "be reachable):\n" + ("\n".join(within) if within else "- none"))
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
