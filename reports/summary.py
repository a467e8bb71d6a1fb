"""The summary at the top of the parity document: one screen a reviewer can act on.

Per shape: every arm's median, its speedup against the baseline with the CI and verdict of
the one statistics rule (`reports.stats`), the fastest arm among those that do the exact work,
and gradient parity as PASS / FAIL with rel_l2, the tolerance and a FAIL's known cause
(`reports.parity`). Then the cells whose timings are unstable and the cells that failed.
"""

from __future__ import annotations

import pandas as pd

from reports import baseline, stats
from reports.parity import GRAD_TOLERANCE, PASS
from reports.tables import (
    by_shape,
    fails_parity,
    failure_message,
    markdown,
    not_comparable,
    ok,
    recompiles,
    shape_label,
    speedup_text,
    verdict_of,
)


def _parity(row) -> str:
    verdict = verdict_of(row)
    if verdict is None:
        return "not checked"
    rel = "not finite" if verdict.rel_l2 is None else f"{verdict.rel_l2:.2e}"
    if verdict.passed:
        return f"PASS {rel}"
    return f"**FAIL** {rel}: {verdict.cause}"


def _shape_rows(frame: pd.DataFrame, label: str, group: pd.DataFrame, baseline_arm: str
                ) -> tuple[list[tuple], list[str]]:
    """The summary rows of one shape (fastest first) and the notes they need."""
    group = group.sort_values("median_ms", kind="stable")
    # The fastest is chosen among the arms doing the baseline's work: parity PASS, and the
    # same compiled FLOPs per model FLOP (reports.work).
    exact = [r for _, r in group.iterrows()
             if not fails_parity(r) and not not_comparable(frame, r, baseline_arm)]
    fastest = exact[0]["arm"] if exact else None
    rows, notes = [], []
    for _, r in group.iterrows():
        ratio, verdict = speedup_text(frame, r, baseline_arm)
        if r["arm"] == baseline_arm:
            ratio = "1.00x (baseline)"
        caveat = not_comparable(frame, r, baseline_arm)
        arm = f"**{r['arm']}** (fastest)" if r["arm"] == fastest else r["arm"]
        rows.append((label, arm, f"{r['median_ms']:.1f}", ratio,
                     "; ".join(v for v in (verdict, caveat) if v), _parity(r)))
        if fastest and r["arm"] != fastest and r["median_ms"] < exact[0]["median_ms"]:
            why = ("fails gradient parity" if fails_parity(r) else
                   f"does {caveat.removesuffix('; not comparable work')}")
            notes.append(f"{label}: {r['arm']} has a lower median ({r['median_ms']:.1f} ms) "
                         f"than {fastest} but {why}, so it is not the fastest at the same "
                         "work.")
        if r["arm"] == baseline_arm and fails_parity(r):
            notes.append(f"{label}: the baseline {baseline_arm} fails gradient parity, so "
                         "its time is not the exact work and no speedup against it here "
                         "compares like with like.")
    if fastest is None:
        notes.append(f"{label}: every arm fails gradient parity or does other work than the "
                     "baseline; no arm is the fastest at the same work.")
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
    bad = by_shape(df[df["status"] != "ok"])
    if bad.empty:
        return "Failed cells: none."
    lines = [f"- {shape_label(r)} {r['arm']}: {r['error_reason']}: {failure_message(r, 120)}"
             for _, r in bad.iterrows()]
    return "\n".join([f"**Failed cells: {len(bad)}** (not timed; details below)", *lines])


def summary(df: pd.DataFrame, baseline_arm: str, how: str = "") -> str:
    """The summary section's markdown (without its heading); `how` says how the baseline
    was chosen."""
    frame = by_shape(ok(df))
    rows, notes = [], []
    labels = [shape_label(r) for _, r in frame.iterrows()]
    for label in dict.fromkeys(labels):
        group = frame[[x == label for x in labels]]
        shape_rows, shape_notes = _shape_rows(frame, label, group, baseline_arm)
        rows += shape_rows
        notes += shape_notes
    verdicts = [verdict_of(r) for _, r in frame.iterrows()]
    passed = sum(v is not None and v.status == PASS for v in verdicts)
    failed = sum(v is not None and v.status != PASS for v in verdicts)
    unchecked = len(verdicts) - passed - failed
    parts = [
        f"Baseline: **{baseline_arm}** ({how or baseline.describe()}). "
        "Speedup = median ms/step of the baseline / median of the arm: above 1.00x the arm is "
        f"faster. [95% CI] and verdict by reports.stats (a verdict needs "
        f"{stats.MIN_EFFECT:.0%}+ and enough rounds). Gradient parity: rel_l2 of the gradient "
        "the optimizer saw vs the exact sum/sum gradient, PASS at <= "
        f"{GRAD_TOLERANCE:g}; an arm that fails is still timed, but its time is not "
        "comparable work.",
        markdown(["shape", "arm", "median ms", f"speedup vs {baseline_arm} [95% CI]",
                  "verdict", f"gradient parity (rel_l2, PASS <= {GRAD_TOLERANCE:g})"],
                 rows) if rows else "No timed cells.",
        f"Gradient parity: {passed} PASS, {failed} FAIL"
        + (f", {unchecked} not checked" if unchecked else "") + ".",
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
