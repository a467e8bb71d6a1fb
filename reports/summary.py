"""The summary at the top of the parity document: one screen a reviewer can act on.

What is decided comes first. Per shape:
1. the exact comparisons against the baseline, each a ratio that needs no CI: bytes accessed
   per step, planned peak (the most an executable of the step has in memory: its own
   buffers and the train state held beside it), program calls per step (the executables the
   arm calls; a traced window's different count of device executions beside it), compiled
   FLOPs per model FLOP and, where `parity plan` planned the same shape, the target's
   planned peak, HBM and collective bytes per step;
2. gradient parity as PASS / FAIL with rel_l2, the tolerance and a FAIL's known cause
   (`reports.parity`);
3. timing: every arm's median and speedup with the CI and verdict of the one statistics rule
   (`reports.stats`). An arm is called the fastest only when its lead over every other arm
   doing the baseline's work is itself a verdict; otherwise the shape has "no timing verdict"
   and the noise (the MDE of the closest pair) is said.
Then the cells whose timings are unstable and the cells that failed.
"""

from __future__ import annotations

import pandas as pd

from reports import baseline, stats
from reports.parity import PASS, TOLERANCE_RULE
from reports.tables import (
    MISSING,
    arm_label,
    arm_view,
    by_shape,
    compare_rows,
    failed,
    fails_parity,
    failure_message,
    is_baseline,
    markdown,
    not_checked,
    not_comparable,
    not_run,
    number,
    ok,
    plan_sourced,
    recompiles,
    same_shape,
    shape_label,
    speedup,
    speedup_text,
    verdict_of,
    work_ratio,
)
from reports.work import different_work

EXACT = [  # (column, header, format of one value)
    ("bytes_accessed_per_step", "bytes accessed/step", lambda v: f"{v / 2**20:.1f} MiB"),
    ("planned_bytes", "planned peak (executable + held state)", lambda v: f"{v / 2**20:.1f} MiB"),
    ("executions_per_step", "program calls/step", lambda v: f"{v:.0f}"),
    ("flops_per_model_flop", "compiled/model FLOPs", lambda v: f"{v:.3f}"),
]
PLANNED = [  # the same, from a `parity plan` record of the same arm and shape
    ("plan_peak", "planned peak on {target}", lambda v: f"{v / 2**30:.3f} GiB"),
    ("plan_hbm_per_step", "HBM/step on {target}", lambda v: f"{v / 2**30:.3f} GiB"),
    ("plan_collective_bytes", "collective bytes/step on {target}",
     lambda v: f"{v / 2**30:.3f} GiB"),
    ("plan_flops_per_step", "FLOPs/step on {target}", lambda v: f"{v / 1e12:.3f} T"),
]


REPEATED = ("plan_peak", "plan_hbm_per_step", "plan_flops_per_step")
"""PLANNED columns that repeat an EXACT one where a cell carries its own plan: its planned
peak is the executables' own, its HBM bytes and FLOPs are the EXACT columns' source."""
SOURCED = ("bytes_accessed_per_step", "flops_per_model_flop")
"""EXACT columns whose figure may come from a plan or from the runtime's cost model."""


def _source_tag(frame: pd.DataFrame, row, column) -> str:
    """' [plan]' or ' [runtime]' after a sourced figure where the rows of its shape mix the
    two sources (then the figures are not one count; each says which it is), '' else."""
    if column not in SOURCED or "cost_source" not in row.index or _value(row, column) is None:
        return ""
    sources = set(same_shape(frame, row, None)["cost_source"].dropna())
    return f" [{row['cost_source']}]" if len(sources) > 1 else ""


def _value(row, column):
    if row is None or column not in row.index:
        return None
    return number(row[column])


def _exact_cell(row, base, column, fmt) -> str:
    """'2179.5 MiB (0.74x)': the value and its ratio to the baseline's."""
    mine, theirs = _value(row, column), _value(base, column)
    if mine is None:
        return MISSING
    ratio = f" ({mine / theirs:.2f}x)" if theirs else ""
    return fmt(mine) + ratio


def _traced_note(row, column) -> str:
    """' [20 in trace]' after the program calls per step where a traced window counted a
    different number of device executions per step: a trainer that runs small programs of
    its own around its kernels (MaxText's engine) calls 2 but executes 20 at GA 1, and the
    first figure alone would read as the device's. '' for every other column."""
    if column != "executions_per_step":
        return ""
    calls, traced = _value(row, column), _value(row, "trace_executions")
    return f" [{traced:.0f} in trace]" if traced is not None and traced != calls else ""


def _plan_of(plans: pd.DataFrame | None, row):
    """The ok plan record of this arm at this shape, or None."""
    if plans is None or plans.empty:
        return None
    same = same_shape(ok(plans), row, row["arm"])
    return same.iloc[0] if not same.empty else None


def _exact_columns(frame: pd.DataFrame) -> list[tuple]:
    """EXACT, each figure from one count for every arm: where cells ran on an accelerator
    with the plan of their own program (reports.frame.cost_source), their compiled FLOPs and
    bytes are that plan's, said in the header, and the plan's own columns are not repeated."""
    if not plan_sourced(frame):
        return EXACT
    relabelled = {"bytes_accessed_per_step": "HBM bytes/step (plan)",
                  "flops_per_model_flop": "planned matmul/model FLOPs"}
    return [(c, relabelled.get(c, h), f) for c, h, f in EXACT]


def exact(frame: pd.DataFrame, baseline_arm: str, plans: pd.DataFrame | None = None) -> str:
    """The exact comparisons of every timed cell against the baseline arm of its shape."""
    own = "plan_for" in frame and frame["plan_for"].notna().any()
    if own:  # cells run on an accelerator carry the plan of their own program there
        target = ", ".join(dict.fromkeys(frame["plan_for"].dropna()))
    else:
        target = (", ".join(dict.fromkeys(ok(plans)["plan_target"]))
                  if plans is not None and not ok(plans).empty else "")
    planned = [(c, h.format(target=target), f) for c, h, f in PLANNED
               if not (own and c in REPEATED)] if target else []
    columns = [*_exact_columns(frame), *planned]  # a new list: EXACT stays as it is
    rows = []
    for _, r in frame.iterrows():
        base_rows = same_shape(frame, r, baseline_arm)
        base = base_rows.iloc[0] if not base_rows.empty else None
        cells = [_exact_cell(r, base, c, f) + _traced_note(r, c) + _source_tag(frame, r, c)
                 for c, _, f in columns[:len(EXACT)]]
        if target:
            plan, base_plan = ((r, base) if own else
                               (_plan_of(plans, r),
                                None if base is None else _plan_of(plans, base)))
            cells += [_exact_cell(plan, base_plan, c, f) for c, _, f in planned]
        rows.append((shape_label(r), arm_label(r), *cells))
    return markdown(["shape", "arm", *[h for _, h, _ in columns]], rows,
                    why={"compiled/model FLOPs": "no model FLOP formula or compiled cost"})


def _parity(row) -> str:
    verdict = verdict_of(row)
    if verdict is None:
        return not_checked(row)
    rel = "not finite" if verdict.rel_l2 is None else f"{verdict.rel_l2:.2e}"
    float32 = number(row.get("float32_rel_l2"))
    if float32 is not None:  # where the arithmetic rounds: the arm's distance from float32
        rel += f"; vs exact float32 {float32:.2e}"
    if verdict.passed:
        return f"PASS {rel}"
    return f"**FAIL** {rel}: {verdict.cause}"


def gradient_parity(frame: pd.DataFrame) -> str:
    rows = [(shape_label(r), arm_label(r), _parity(r)) for _, r in frame.iterrows()]
    verdicts = [verdict_of(r) for _, r in frame.iterrows()]
    passed = sum(v is not None and v.status == PASS for v in verdicts)
    failed = sum(v is not None and v.status != PASS for v in verdicts)
    unchecked = len(verdicts) - passed - failed
    return "\n\n".join([
        markdown(["shape", "arm", f"gradient parity (rel_l2, {TOLERANCE_RULE})"],
                 rows),
        f"Gradient parity: {passed} PASS, {failed} FAIL"
        + (f", {unchecked} not checked" if unchecked else "") + "."])


def _baselines_work(frame: pd.DataFrame, row, baseline_arm: str) -> bool:
    """Does the arm do the baseline's work (the same compiled FLOPs per model FLOP, within
    reports.work's tolerance)? A baseline failing gradient parity still sets the work."""
    base = same_shape(frame, row, baseline_arm)
    return base.empty or not different_work(work_ratio(row), work_ratio(base.iloc[0]))


def fastest(frame: pd.DataFrame, group: pd.DataFrame, baseline_arm: str
            ) -> tuple[str | None, str]:
    """(the fastest arm of one shape as its rows name it, or None; why). Among the arms
    doing the baseline's work (parity PASS, the same compiled FLOPs per model FLOP), the one
    with the lowest median is the fastest only when the statistics rule calls it faster
    than each other such arm; otherwise why not, with the noise of the closest pair (its
    MDE)."""
    exact_arms = [r for _, r in group.sort_values("median_ms", kind="stable").iterrows()
                  if not fails_parity(r) and _baselines_work(frame, r, baseline_arm)]
    if len(exact_arms) < 2:
        return None, "fewer than two arms doing the same work"
    leader, runner_up = exact_arms[0], exact_arms[1]
    name = arm_label(leader)
    for other in exact_arms[1:]:
        c = compare_rows(leader, other)
        if stats.verdict(c) != stats.SLOWER:  # the other arm is not slower
            closest = compare_rows(leader, runner_up)
            return None, (f"no timing verdict (noise {closest.mde:.0%}: {name} vs "
                          f"{arm_label(runner_up)} {closest.ratio:.2f}x, "
                          f"{arm_view(closest)})")
    return name, f"{name} is faster than every other arm beyond noise"


def timing_rule(frame: pd.DataFrame, baseline_arm: str) -> str:
    """' Used here: <minimum effect and process spread>.' of the speedups against the
    baseline (stats.rule), or '' where there are none."""
    found = [c for _, r in frame.iterrows() if not is_baseline(frame, r, baseline_arm)
             and (c := speedup(frame, r, baseline_arm)) is not None]
    used = stats.rule(found)
    return f" Used here: {used}." if used else ""


def _shape_rows(frame: pd.DataFrame, label: str, group: pd.DataFrame, baseline_arm: str
                ) -> tuple[list[tuple], list[str]]:
    """The timing rows of one shape (lowest median first) and the notes they need."""
    group = group.sort_values("median_ms", kind="stable")
    leader, why = fastest(frame, group, baseline_arm)
    rows, notes = [], [f"{label}: " + (f"fastest **{leader}** ({why})" if leader else why)]
    leader_ms = next((o["median_ms"] for _, o in group.iterrows() if arm_label(o) == leader),
                     None)
    for _, r in group.iterrows():
        ratio, verdict = speedup_text(frame, r, baseline_arm)
        if is_baseline(frame, r, baseline_arm):
            ratio = "1.00x (baseline)"
        caveat = not_comparable(frame, r, baseline_arm)
        arm = f"**{arm_label(r)}** (fastest)" if arm_label(r) == leader else arm_label(r)
        rows.append((label, arm, f"{r['median_ms']:.1f}", ratio,
                     "; ".join(v for v in (verdict, caveat) if v)))
        if leader and r["median_ms"] < leader_ms:
            why_not = ("fails gradient parity" if fails_parity(r) else
                       f"does {caveat.removesuffix('; not comparable work')}")
            notes.append(f"{label}: {arm_label(r)} has a lower median ({r['median_ms']:.1f} ms) "
                         f"than {leader} but {why_not}, so it is not the fastest at the same "
                         "work.")
        if is_baseline(frame, r, baseline_arm) and fails_parity(r):
            notes.append(f"{label}: the baseline {baseline_arm} fails gradient parity, so "
                         "its time is not the exact work and no speedup against it here "
                         "compares like with like.")
    return rows, notes


def _instability(frame: pd.DataFrame) -> str:
    warned = [f"- {shape_label(r)} {r['arm']}: {'; '.join(r['warnings'])}"
              for _, r in frame.iterrows() if r["warnings"]]
    if not warned:
        return "Instability warnings (reports.stats): none."
    return "\n".join([
        f"<details><summary>Instability warnings (reports.stats): {len(warned)} of "
        f"{len(frame)} cells; their timings scatter, so their CIs are wide</summary>", "",
        *warned, "", "</details>"])


def _failed(df: pd.DataFrame) -> str:
    bad = by_shape(failed(df))
    skipped = not_run(df)
    if bad.empty:
        return "Failed cells: none." + (f"\n\n{skipped}" if skipped else "")
    lines = [f"- {shape_label(r)} {r['arm']}: {r['error_reason']}: {failure_message(r, 120)}"
             for _, r in bad.iterrows()]
    return "\n".join([f"**Failed cells: {len(bad)}** (not timed; details below)", *lines]) + (
        f"\n\n{skipped}" if skipped else "")


def summary(df: pd.DataFrame, baseline_arm: str, how: str = "",
            plans: pd.DataFrame | None = None) -> str:
    """The summary section's markdown (without its heading); `how` says how the baseline
    was chosen; `plans`: `parity plan` records whose shapes join the exact comparisons."""
    frame = by_shape(ok(df))
    rows, notes = [], []
    labels = [shape_label(r) for _, r in frame.iterrows()]
    for label in dict.fromkeys(labels):
        group = frame[[x == label for x in labels]]
        shape_rows, shape_notes = _shape_rows(frame, label, group, baseline_arm)
        rows += shape_rows
        notes += shape_notes
    parts = [
        f"Baseline: **{baseline_arm}** ({how or baseline.describe()}).",
        "**Exact comparisons** (deterministic for given code and versions: no CI is "
        "needed; ratio to the baseline in brackets). Bytes, planned peak and FLOPs are "
        "XLA's figures for the compiled step on this backend, loops counted as they run; "
        "figures \"on\" a target are its compiler's plan (`parity plan`, or a cell's fit check "
        "on its own accelerator, of the program it then ran), not a measurement. "
        "Program calls/step counts the executables the arm calls per optimizer step; "
        "\"[N in trace]\" follows where the traced window saw N device executions per step "
        "instead.",
        exact(frame, baseline_arm, plans) if len(frame) else "No timed cells.",
        "**Gradient parity**: rel_l2 of the gradient the optimizer saw vs the exact sum/sum "
        "gradient; an arm that fails is still timed, but its time is not comparable work.",
        gradient_parity(frame) if len(frame) else "No checked cells.",
        "**Timing**. Speedup = median ms/step of the baseline / median of the arm: above "
        "1.00x the arm is faster; [95% CI] and verdict by reports.stats, said from the "
        f"arm's side. {stats.LEGEND}{timing_rule(frame, baseline_arm)} The fastest is "
        "named only where its lead is faster.",
        markdown(["shape", "arm", "median ms", f"speedup vs {baseline_arm} [95% CI]",
                  "verdict"], rows) if rows else "No timed cells.",
    ]
    if notes:
        parts.append("\n".join(f"- {note}" for note in notes))
    parts.append(_instability(frame))
    recompiled = recompiles(frame)
    if recompiled:
        parts.append("**Compiled after warmup** (the timing includes compilation):\n"
                     + "\n".join(f"- {line}" for line in recompiled))
    parts.append(_failed(df))
    return "\n\n".join(parts)
