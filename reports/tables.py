"""Markdown tables from the results DataFrame (pure functions: frame in, text out).

Rows are grouped by shape (the shape label is written once, on the first row of its group)
and a column with no value in any row is left out, with a note saying which and why.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence

import pandas as pd

from reports import stats
from reports.parity import TOLERANCE_RULE, ParityVerdict
from reports.record import UNAVAILABLE, ExecutableMemory
from reports.viewers import viewer_commands
from reports.work import different_work

SHAPE = ["preset", "seq", "batch", "ga", "mesh", "dtype"]
NATIVE = "native"
MISSING = "-"
"""What a cell without a value shows; a column of nothing else is dropped."""


def markdown(header: Sequence[str], rows: Sequence[Sequence], *, group: int = 1,
             why: Mapping[str, str] | None = None) -> str:
    """A markdown table. The first `group` columns are written only where they change (a
    column is blanked while it and every column before it repeat the row above). A column
    that is MISSING in every row is left out and named in a note below the table, with its
    reason from `why` where given."""
    rows = [[str(c) for c in row] for row in rows]
    keep = [i for i in range(len(header))
            if not rows or any(row[i] != MISSING for row in rows)]
    dropped = [header[i] for i in range(len(header)) if i not in keep]
    shown = []
    for n, row in enumerate(rows):
        cells = list(row)
        for i in range(min(group, len(cells))):
            if n and row[:i + 1] == rows[n - 1][:i + 1]:
                cells[i] = ""
        shown.append([cells[i] for i in keep])
    lines = ["| " + " | ".join(header[i] for i in keep) + " |",
             "|" + "|".join(["---"] * len(keep)) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in shown]
    if dropped:
        why = why or {}
        named = [f"{name} ({why[name]})" if name in why else name for name in dropped]
        lines += ["", f"Not shown, no value in any row: {', '.join(named)}."]
    return "\n".join(lines)


def _known(value) -> bool:
    """A number that is there and not zero (a ratio's denominator)."""
    return value is not None and not pd.isna(value) and bool(value)


def _f(value, spec=".1f") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return MISSING
    return format(value, spec)


def _bytes(value) -> str:
    if value is None or pd.isna(value):
        return MISSING
    return f"{value / 2**20:.1f} MiB"


def shape_label(row) -> str:
    mesh = "" if row["mesh"] in ("1", "", None) else f" mesh {row['mesh']}"
    loss = "" if row.get("loss_kind") in ("xent", None) else f" {row['loss_kind']}"
    return (f"{row['preset']} s{row['seq']} b{row['batch']} ga{row['ga']}{mesh} "
            f"{row['dtype']}{loss}")


def arm_label(row) -> str:
    """The arm as a table's row names it: with our decoder's options where not the defaults
    ('engine (attention=splash/512x1024)'), so a reader sees how each arm computed."""
    options = row.get("decoder_options")
    return f"{row['arm']} ({options})" if options else row["arm"]


def ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"]


def by_shape(df: pd.DataFrame) -> pd.DataFrame:
    """The rows with each shape's rows together, shapes in order of first appearance (a
    stable reorder: arms keep their order inside a shape)."""
    if df.empty:
        return df
    labels = [shape_label(r) for _, r in df.iterrows()]
    first = {label: n for n, label in reversed(list(enumerate(labels)))}
    order = sorted(range(len(df)), key=lambda n: first[labels[n]])
    return df.iloc[order]


def _arm_label(arm: str, about: str) -> str:
    return f"{arm} ({about})" if about else arm


def setup(df: pd.DataFrame) -> str:
    ok_rows = ok(df)
    shas = sorted(set(df["code"].fillna("?")))
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


def plan_sourced(frame: pd.DataFrame) -> bool:
    """Every cost figure of `frame` is its cell's own plan's (reports.frame.cost_source)."""
    return set(frame.get("cost_source", pd.Series(dtype=object)).dropna()) == {"plan"}


def same_shape(df: pd.DataFrame, row, arm: str | None) -> pd.DataFrame:
    """The rows of `df` of `row`'s shape and arm `arm` (None: every arm). Where `arm` ran
    there with more than one set of our decoder's options, the rows of one set
    (`_one_option_set`): an arm's counterpart is one computation, never the first found."""
    same = df if arm is None else df[df["arm"] == arm]
    for col in SHAPE:
        same = same[same[col] == row[col]]
    if arm is None or "decoder_options" not in same or len(same) < 2:
        return same
    return _one_option_set(same, row, arm)


def _one_option_set(same: pd.DataFrame, row, arm: str) -> pd.DataFrame:
    """Of `arm`'s rows at `row`'s shape, those `row` is compared with: another arm's with
    `row`'s own options where it ran them (the same computation, so the trainers differ
    alone); else, and always for `row`'s own arm, the defaults' (`engine (attention=
    splash)` is set against the plain engine, not against itself); else the first set."""
    options = same["decoder_options"].fillna("")
    if options.nunique() < 2:
        return same
    own = row.get("decoder_options") or ""
    if arm != row["arm"] and (options == own).any():
        return same[options == own]
    if (options == "").any():
        return same[options == ""]
    return same[options == options.iloc[0]]


def is_baseline(df: pd.DataFrame, row, arm: str) -> bool:
    """Is `row` itself `arm`'s row at its shape (its speedup against `arm` is 1.00x by
    definition)? An arm run with other options than its counterpart's is not."""
    if row["arm"] != arm:
        return False
    same = same_shape(ok(df), row, arm)
    return same.empty or row.name in same.index


def arm_view(c: stats.Comparison) -> str:
    """stats.label of (old = the arm, new = the other arm), said from the arm's side: the
    other arm slower is the arm faster; the other labels read the same from either side
    (the speedup beside them says which way)."""
    return {stats.SLOWER: "faster", stats.FASTER: "slower"}.get(stats.verdict(c),
                                                                 stats.label(c))


@functools.lru_cache(maxsize=4096)
def _compare(arm_runs: tuple, other_runs: tuple, paired: bool,
             busy: bool = False, backend: str | None = None) -> stats.Comparison:
    """stats.compare, remembered: every table, the summary and the chart ask for the same
    pairs, and one bootstrap is 10,000 resamples."""
    return stats.compare(arm_runs, other_runs, paired=paired, busy=busy, backend=backend)


def speedup(df: pd.DataFrame, row, other_arm: str) -> stats.Comparison | None:
    """median(other) / median(arm) with its CI for the same shape (above 1: the arm is
    faster), by the one statistics rule; rounds that ran interleaved compare as pairs.
    None when the other arm has no timed cell of this shape."""
    same = same_shape(ok(df), row, other_arm)
    return None if same.empty else compare_rows(row, same.iloc[0])


def compare_rows(row, other) -> stats.Comparison:
    """median(other) / median(row) with its CI: `speedup` once the other row is found."""
    busy = bool(row.get("busy")) or bool(other.get("busy"))
    backend = stats.one_backend([row.get("backend"), other.get("backend")])
    if row["slices"] and other["slices"] and row["round_ids"] == other["round_ids"]:
        # Timed in the same processes, in alternating slices: slice pairs.
        return _compare_slices(_frozen(row["slices"]), _frozen(other["slices"]), busy,
                               backend)
    # Rounds of one run ran interleaved (this arm's round r next to the other's): pairs.
    paired = [run for run, _ in other["round_ids"]] == [run for run, _ in row["round_ids"]]
    return _compare(tuple(map(tuple, row["runs"])), tuple(map(tuple, other["runs"])), paired,
                    busy, backend)


def _frozen(slices) -> tuple:
    return tuple(tuple(tuple(s) for s in process) for process in slices)


@functools.lru_cache(maxsize=1024)
def _compare_slices(arm_slices: tuple, other_slices: tuple, busy: bool = False,
                    backend: str | None = None) -> stats.Comparison:
    return stats.compare_slices(arm_slices, other_slices, busy=busy, backend=backend)


def speedup_text(df: pd.DataFrame, row, other_arm: str) -> tuple[str, str]:
    """("1.23x [1.05, 1.40]", the arm's verdict) against `other_arm`; ("1.00x", "") for the
    arm itself, (MISSING, "") where the other arm has no cell of this shape. Arms that do
    not do the same work (`not_comparable`) get no verdict: their times compare programs,
    not trainers."""
    if is_baseline(df, row, other_arm):
        return "1.00x", ""
    c = speedup(df, row, other_arm)
    if c is None:
        return MISSING, ""
    text = f"{c.ratio:.2f}x [{c.low:.2f}, {c.high:.2f}]"
    return text, "" if not_comparable(df, row, other_arm) else arm_view(c)


def verdict_of(row) -> ParityVerdict | None:
    value = row["parity_verdict"]
    return value if isinstance(value, ParityVerdict) else None


def fails_parity(row) -> bool:
    verdict = verdict_of(row)
    return verdict is not None and not verdict.passed


def not_comparable(df: pd.DataFrame, row, other_arm: str) -> str:
    """Why the arm's time is not comparable with `other_arm`'s at this shape ('' if it is):
    one of them fails gradient parity, or their compiled FLOPs per model FLOP differ by more
    than reports.work.WORK_TOLERANCE; either way they do not do the same work."""
    if is_baseline(df, row, other_arm):
        return ""
    others = same_shape(ok(df), row, other_arm)
    mine = fails_parity(row)
    theirs = any(fails_parity(o) for _, o in others.iterrows())
    if mine or theirs:
        who = "both fail" if mine and theirs else "fails" if mine else f"{other_arm} fails"
        return f"not comparable work ({who} parity)"
    for _, other in others.iterrows():
        differ = different_work(work_ratio(row), work_ratio(other))
        if differ:
            return f"{differ}; not comparable work"
    return ""


def number(value) -> float | None:
    """A frame cell as a float; None where it holds none (None, or NaN)."""
    return None if value is None or pd.isna(value) else float(value)


def work_ratio(row) -> float | None:
    return number(row["flops_per_model_flop"])


def parity_cell(row) -> str:
    """'PASS', 'FAIL' or 'not checked' (with why, where a check was asked for)."""
    verdict = verdict_of(row)
    return verdict.status if verdict else not_checked(row)


def not_checked(row, limit: int = 120) -> str:
    """'not checked', with why where the check was asked for and gave no verdict
    (Record.parity_not_checked: 'not checked (oom: ...)')."""
    why = row.get("parity_not_checked")
    if not why or pd.isna(why):
        return "not checked"
    return "not checked (" + str(why)[:limit].replace("|", "\\|").replace("\n", " ") + ")"


def _median_ci(r) -> str:
    if r["median_low"] is None or pd.isna(r["median_low"]):
        return _f(r["median_ms"])
    return f"{r['median_ms']:.1f} [{r['median_low']:.1f}, {r['median_high']:.1f}]"


def timing(df: pd.DataFrame, baseline_arm: str) -> str:
    frame = by_shape(ok(df))
    rows = []
    for _, r in frame.iterrows():
        vs_base, base_verdict = speedup_text(frame, r, baseline_arm)
        caveat = not_comparable(frame, r, baseline_arm)
        vs_native = speedup_text(frame, r, NATIVE)[0] if baseline_arm != NATIVE else MISSING
        rows.append((shape_label(r), arm_label(r), r["rounds"], _median_ci(r), _f(r["mean_ms"]),
                     _f(r["max_ms"]), _f(r["tokens_per_s"], ".0f"), vs_base,
                     "; ".join(v for v in (base_verdict, caveat) if v), vs_native,
                     parity_cell(r)))
    return markdown(["shape", "arm", "rounds", "median ms [95% CI over rounds]", "mean ms",
                     "max ms", "tok/s", f"speedup vs {baseline_arm} [95% CI]", "vs baseline",
                     "speedup vs native", "gradient parity"], rows,
                    why={"speedup vs native": "native is the baseline or absent"})


def _gflop(value) -> str:
    return _f(None if value is None or pd.isna(value) else value / 1e9, ".4g")


def cost(df: pd.DataFrame) -> str:
    """Model FLOPs (one formula for every arm), compiled FLOPs and bytes (XLA, loop-aware)."""
    rows = []
    frame = by_shape(ok(df))
    for _, r in frame.iterrows():
        model, compiled = r["model_flops_per_step"], r["compiled_flops_per_step"]
        ratio = _f(work_ratio(r), ".2f")
        rows.append((shape_label(r), arm_label(r), _gflop(model), _gflop(compiled), ratio,
                     _bytes(r["bytes_accessed_per_step"]),
                     _f(None if r["model_flops_per_s"] is None
                        else r["model_flops_per_s"] / 1e12, ".4f"),
                     _f(r["mfu"], ".1%"), _f(r["executions_per_step"], ".0f"),
                     _f(r["compiles"], ".0f")))
    unavailable = [f"- {shape_label(r)} {r['arm']}: {r['cost_unavailable']}"
                   for _, r in frame.iterrows() if isinstance(r["cost_unavailable"], str)]
    planned = plan_sourced(frame)
    compiled_head = ("planned matmul GFLOP/step per device (plan)" if planned
                     else "compiled GFLOP/step per device")
    text = markdown(["shape", "arm", "model GFLOP/step", compiled_head,
                     "compiled x devices / model",
                     "HBM bytes/step (plan)" if planned else "bytes accessed/step",
                     "model TFLOP/s", "MFU", "program calls/step", "compiles"], rows,
                    why={"MFU": "needs model FLOPs and the device's peak FLOP/s",
                         "compiles": "not in these records"})
    if unavailable:
        text += "\n\nCompiled cost unavailable:\n" + "\n".join(unavailable)
    return text


def memory(df: pd.DataFrame, baseline_arm: str) -> str:
    rows = []
    frame = by_shape(ok(df))
    for _, r in frame.iterrows():
        base = same_shape(frame, r, baseline_arm)
        known = not base.empty and _known(r["planned_bytes"])
        ratio = (f"{r['planned_bytes'] / base.iloc[0]['planned_bytes']:.2f}x"
                 if known and _known(base.iloc[0]["planned_bytes"]) else MISSING)
        rows.append((shape_label(r), arm_label(r), _bytes(r["peak_bytes"]),
                     _bytes(r["planned_bytes"]), ratio, _bytes(r["rss_delta_bytes"])))
    why = next((w for w in frame.get("peak_unavailable", pd.Series(dtype=object)).dropna()),
               "the backend has no memory_stats")
    text = markdown(["shape", "arm", "peak measured (the cell process's since it started)",
                     "planned peak (executable + held state)", f"planned vs {baseline_arm}",
                     "RSS high-water delta"], rows,
                    why={"peak measured (the cell process's since it started)": why})
    unplanned = [f"- {shape_label(r)} {r['arm']}: {r['planned_unavailable']}"
                 for _, r in frame.iterrows() if isinstance(r.get("planned_unavailable"), str)]
    if unplanned:
        text += "\n\nPlanned peak unavailable:\n" + "\n".join(unplanned)
    return text


def executables(df: pd.DataFrame) -> str:
    """Every executable of every cell: calls per step and each field XLA's memory_analysis
    gives (a field added to `ExecutableMemory` appears here with no other change)."""
    fields = [f.name for f in dataclasses.fields(ExecutableMemory)]
    rows = []
    for _, r in by_shape(ok(df)).iterrows():
        for name, planned in r["executables"].items():
            values = [_bytes(getattr(planned, f)) if planned else MISSING for f in fields]
            rows.append((shape_label(r), arm_label(r), name,
                         _f(r["calls_per_step"].get(name), "d"), *values))
    return markdown(["shape", "arm", "executable", "calls/step", *fields], rows, group=2)


def losses(df: pd.DataFrame) -> str:
    """'Loss: ...' for each loss the cells ran (the function, its version and options)."""
    labels = dict.fromkeys(ok(df)["loss_label"]) if "loss_label" in df else {}
    return "\n".join(f"Loss: {label}." for label in labels if isinstance(label, str))


def parity(df: pd.DataFrame) -> str:
    rows = []
    for _, r in by_shape(ok(df)).iterrows():
        found = r["denominators"]  # a list, or NaN where the cell has no check
        dens = ("/".join(f"{d:g}" for d in found)
                if found is not None and not isinstance(found, float) and len(found)
                else MISSING)
        verdict = verdict_of(r)
        rows.append((shape_label(r), arm_label(r), dens, _f(r["denominator"], "g"),
                     _f(r["trainer_denominator"], "g"),
                     _f(r["loss"], ".6f"), _f(r["exact_loss"], ".6f"), _f(r["grad_l2"], ".5f"),
                     _f(r["rel_l2"], ".2e"),
                     f"{verdict.status}{': ' + verdict.cause if verdict.cause else ''}"
                     if verdict else not_checked(r),
                     r["data_digest"][:12] if isinstance(r["data_digest"], str) else MISSING))
    return markdown(["shape", "arm", "micro-batch denominators", "sum",
                     "trainer's denominator", "loss (trainer)",
                     "exact loss", "gradient L2", "rel_l2 vs exact",
                     f"verdict ({TOLERANCE_RULE})", "data"], rows)


def traced(df: pd.DataFrame) -> str:
    rows = []
    for _, r in by_shape(ok(df)).iterrows():
        gc = (MISSING if r["gc_count"] is None or pd.isna(r["gc_count"])
              else f"{r['gc_count']:.0f} / {_f(r['gc_ms'], '.1f')} ms")
        logdir = r.get("trace_logdir")
        open_with = (f"`{viewer_commands(logdir)['xprof']}`" if isinstance(logdir, str)
                     else MISSING)
        traced_ms, untraced_ms = number(r["trace_step_ms"]), number(r["median_ms"])
        tax = (f"{traced_ms / untraced_ms:.3f}x" if traced_ms is not None and untraced_ms
               else MISSING)
        rows.append((shape_label(r), arm_label(r), _f(r["trace_executions"], ".0f"),
                     _f(untraced_ms), _f(traced_ms), tax, _f(r["trace_busy_ms"]),
                     _f(r["trace_host_ms"]), _f(r["dispatch_ms"], ".2f"), gc,
                     _f(r["recompiles"], ".0f"), open_with))
    return markdown(["shape", "arm", "executions/step (trace)", "untraced ms/step",
                     "traced ms/step", "tracing tax (traced / untraced)", "busy ms (trace)",
                     "host ms (trace)", "dispatch ms (untraced)", "GC pauses (untraced)",
                     "recompiles after warmup", "open the trace"],
                    rows, why={name: "no traced window" for name in (
                        "executions/step (trace)", "traced ms/step",
                        "tracing tax (traced / untraced)", "busy ms (trace)",
                        "host ms (trace)", "open the trace")})


def noise(df: pd.DataFrame, baseline_arm: str) -> str:
    frame = by_shape(ok(df))
    rows = [(shape_label(r), arm_label(r), r["rounds"], _f(r["cv"], ".3f"), len(r["step_ms"]),
             "; ".join(r["warnings"]) or MISSING) for _, r in frame.iterrows()]
    within, judged = [], []
    for _, r in frame.iterrows():
        ratio, verdict = speedup_text(frame, r, baseline_arm)
        c = None if is_baseline(frame, r, baseline_arm) else speedup(frame, r, baseline_arm)
        if c is not None and verdict and verdict not in ("faster", "slower"):
            judged.append(c)
            within.append(f"- {shape_label(r)}: {r['arm']} vs {baseline_arm} {ratio}: "
                          f"{verdict}")
    text = markdown(["shape", "arm", "rounds", "worst CV in a round", "timed steps",
                     "instability"], rows)
    used = stats.rule(judged)
    text += ("\n\nNo faster or slower (the CI includes 1.00x, the difference is under the "
             f"minimum effect, or too few rounds of {stats.MIN_STEPS}+ steps for 95% to be "
             "reachable)" + (f"; used here: {used}" if used else "") + ":\n"
             + ("\n".join(within) if within else "- none"))
    recompiled = recompiles(frame)
    text += ("\n\nCells that compiled after warmup (their timings include compilation; a "
             "trainer that recompiles mid-run):\n"
             + ("\n".join(f"- {line}" for line in recompiled) or "- none"))
    return text


def recompiles(df: pd.DataFrame) -> list[str]:
    """'<shape>: <arm> compiled N more time(s)' for every cell that compiled after warmup."""
    return [f"{shape_label(r)}: {r['arm']} compiled {r['recompiles']:.0f} more time(s)"
            for _, r in by_shape(ok(df)).iterrows()
            if r["recompiles"] and not pd.isna(r["recompiles"])]


def failure_message(row, limit: int = 200) -> str:
    return str(row["error_message"]).replace("|", "\\|").replace("\n", " ")[:limit]


def failed(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of cells that failed to run or plan (not those not run here: `not_run`)."""
    return df[(df["status"] != "ok") & (df["error_reason"] != UNAVAILABLE)]


def not_run(df: pd.DataFrame) -> str:
    """'Not run here: maxtext-engine (why), ...': the arms asked for that this environment
    cannot run (reports.record.UNAVAILABLE), one entry per arm; '' when none."""
    skipped = df[df["error_reason"] == UNAVAILABLE]
    if skipped.empty:
        return ""
    why = dict(zip(skipped["arm"], skipped["error_message"], strict=True))
    return ("**Not run here** (their packages cannot run in this environment; `parity arms` "
            "lists what each needs): " + "; ".join(
                f"{arm} ({message.removeprefix('not run here: ')})"
                for arm, message in why.items()) + ".")


def failures(df: pd.DataFrame) -> str:
    bad = by_shape(failed(df))
    if bad.empty:
        return "No failed cells."
    rows = [(shape_label(r), arm_label(r), r["error_reason"], failure_message(r))
            for _, r in bad.iterrows()]
    return markdown(["shape", "arm", "reason", "message"], rows)
