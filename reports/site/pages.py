"""The site's HTML pages: the index (one row per cell), a page per cell and a page per shape
(its arms side by side). Pure functions from `reports.site.history` to HTML text; the
charts are `reports.site.charts` figures, drawn by plotly.js from the page's own JSON (pages
open from file://, where a page may not fetch another file).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path

from reports import costs, measured, regression
from reports.frame import to_frame
from reports.site import assets, charts
from reports.site.history import (
    VERDICTS,
    CellHistory,
    RunView,
    shape_name,
    shape_slug,
)
from reports.viewers import viewer_commands

SPARK_RUNS = 30
"""Runs a sparkline on the index shows (the latest)."""
RUNS_LISTED = 60
"""Runs in a cell page's table of runs (the latest; the charts show every run)."""


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _head(title: str, depth: int) -> str:
    up = "../" * depth
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(title)}</title>"
            f'<link rel="stylesheet" href="{up}assets/{assets.STYLE}">'
            f'<script src="{up}assets/{assets.PLOTLY}"></script>'
            f'<script src="{up}assets/{assets.SCRIPT}"></script></head><body>\n')


def _figure(target: str, figure: dict | None, empty: str) -> str:
    """A chart's div and the JSON the page script draws into it ('</' escaped, so no string
    in it can close the script element)."""
    if figure is None:
        return f'<p class="note">{_e(empty)}</p>'
    text = json.dumps(figure, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (f'<div class="chart" id="{target}"></div>'
            f'<script type="application/json" class="figure" data-target="{target}">'
            f"{text}</script>\n")


def cell_href(history: CellHistory) -> str:
    return f"cells/{history.id.slug}.html"


def shape_href(shape: tuple) -> str:
    return f"shapes/{shape_slug(shape)}.html"


def verdict_html(view: RunView | None) -> str:
    if view is None:
        return "-"
    css = view.verdict.replace(" ", "-")
    return (f'<span class="verdict v-{css}" title="{_e(view.why)}">{_e(view.verdict)}'
            "</span>")


def median_text(view: RunView | None) -> tuple[str, str]:
    """(text, sort key) of a run's median ms/step with its 95% CI."""
    if view is None or view.median is None:
        return "-", ""
    m = view.median
    ci = f" [{m.low:.4g}, {m.high:.4g}]" if m.low is not None else ""
    return f"{m.median:.4g}{ci}", f"{m.median:.6g}"


def last_change(history: CellHistory) -> tuple[str, str]:
    """(text, ISO time) of the cell's latest cost or plan change (exact, vs the latest
    comparable run), or ('-', '')."""
    found = []
    for views, what in ((history.timed, "cost"), (history.plans, "plan")):
        for view in reversed(views):
            c = view.comparison
            if c is not None and c.cost_changes:
                found.append((view.time, what, view, c.cost_changes))
                break
    if not found:
        return "-", ""
    when, what, view, changes = max(found, key=lambda f: f[0])
    text = "; ".join(ch.text() for ch in changes)
    return f"{charts.x_time(when)[:10]} {what}: {text}", when


def _select(key: str, label: str, values: Sequence[str]) -> str:
    options = "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
    return (f'<label>{_e(label)} <select class="filter" data-key="{key}" id="filter-{key}">'
            f'<option value="">all</option>{options}</select></label>')


HEADERS = (("cell", "text"), ("arm", "text"), ("preset", "text"), ("seq x batch", "text"),
           ("GA", "number"), ("dtype", "text"), ("mesh", "text"), ("backend", "text"),
           ("median ms/step [95% CI]", "number"), (f"last {SPARK_RUNS} runs", None),
           ("last verdict", "text"), ("last cost or plan change", "text"),
           ("runs (+plans)", "number"), ("latest run", "text"))


def index(histories: Sequence[CellHistory], *, source: str, generated: str) -> str:
    """The index: one row per cell, sortable by any column, filterable by arm, preset,
    backend and verdict."""
    rows = []
    for h in histories:
        cid, latest = h.id, h.latest
        median, median_key = median_text(latest)
        change, change_key = last_change(h)
        verdict_view = latest or h.latest_plan
        plan_note = ""
        if h.latest_plan is not None and latest is not None:
            plan_note = f'<br><span class="why">plan: {verdict_html(h.latest_plan)}</span>'
        when = latest or h.latest_plan
        rows.append(
            f'<tr data-arm="{_e(cid.arm)}" data-preset="{_e(cid.preset)}" '
            f'data-backend="{_e(cid.backend)}" '
            f'data-verdict="{_e(verdict_view.verdict if verdict_view else "")}">'
            f'<td><a href="{cell_href(h)}">{_e(cid.name)}</a></td>'
            f"<td>{_e(cid.arm)}</td><td>{_e(cid.preset)}</td>"
            f'<td data-sort="{cid.seq * cid.batch:012d}">{cid.seq} x {cid.batch}</td>'
            f'<td class="num">{cid.ga}</td><td>{_e(cid.dtype)}</td><td>{_e(cid.mesh)}</td>'
            f"<td>{_e(cid.backend)}</td>"
            f'<td class="num" data-sort="{median_key}">{_e(median)}</td>'
            f"<td>{charts.sparkline(h.timed[-SPARK_RUNS:])}</td>"
            f"<td>{verdict_html(verdict_view)}{plan_note}</td>"
            f'<td class="why" data-sort="{_e(change_key)}">{_e(change)}</td>'
            f'<td class="num" title="{len(h.timed)} timed runs, {len(h.plans)} plan runs">'
            f"{len(h.timed)}{f' +{len(h.plans)}p' if h.plans else ''}</td>"
            f'<td data-sort="{_e(when.time if when else "")}">'
            f"{_e(charts.x_time(when.time)[:16] if when else '-')}"
            f"<br><code>{_e(when.code if when else '')}</code></td></tr>")
    head = "".join(
        f'<th class="sortable" data-type="{kind}">{_e(name)}</th>' if kind else
        f"<th>{_e(name)}</th>" for name, kind in HEADERS)
    values = {key: sorted({getattr(h.id, key) for h in histories})
              for key in ("arm", "preset", "backend")}
    shapes = sorted({h.id.shape for h in histories})
    threshold = sorted({h.threshold for h in histories})
    return (_head("parity nightly", 0)
            + "<h1>parity nightly: every cell's history</h1>"
            + f'<p class="note">From <code>{_e(source)}</code>, published {_e(generated)} '
              f"UTC. Median = median over a run's rounds (processes) with its 95% bootstrap CI "
              "over rounds (reports.medians.median_ci). Verdicts are the nightly's "
              "(reports.regression): a run against the last "
              f"{regression.BASELINE_RUNS} comparable runs, slower or faster by at least "
              f"{', '.join(f'{t:.0%}' for t in threshold)} beyond noise, or any exact cost "
              "metric up; runs whose environment (versions, backend, devices, XLA flags) "
              "or config differ are never compared (not comparable: a new baseline).</p>"
            + '<div class="filters">'
            + "".join(_select(key, key, vals) for key, vals in values.items())
            + _select("verdict", "last verdict", VERDICTS)
            + '<label>text <input id="filter-text" type="search" placeholder="filter">'
              '</label><span><span id="shown"></span> of '
            + f"{len(histories)} cells</span></div>"
            + f'<table id="cells"><thead><tr>{head}</tr></thead><tbody>'
            + "\n".join(rows) + "</tbody></table>"
            + "<h2>Arms side by side</h2><ul>"
            + "".join(f'<li><a href="{shape_href(s)}">{_e(shape_name(s))}</a></li>'
                      for s in shapes)
            + "</ul></body></html>\n")


def _runs_table(views: Sequence[RunView], label: str) -> str:
    shown = list(views)[-RUNS_LISTED:][::-1]
    rows = "".join(
        f"<tr><td>{_e(charts.x_time(v.time))}</td><td><code>{_e(v.run_id)}</code></td>"
        f"<td><code>{_e(v.code)}</code></td>"
        f'<td class="num">{_e(median_text(v)[0])}</td><td>{verdict_html(v)}</td>'
        f'<td class="why">{_e(v.why)}</td></tr>' for v in shown)
    return (f"<details><summary>{_e(label)}: the latest {len(shown)} of {len(views)}"
            "</summary><table><thead><tr><th>time (UTC)</th><th>run</th><th>commit</th>"
            "<th>median ms/step [95% CI]</th><th>verdict</th><th>why</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></details>")


def _traces(history: CellHistory) -> str:
    """Links to the captures of the latest run that traced, and the commands serving them."""
    traced = next(([r for r in v.records if r.trace] for v in reversed(history.timed)
                   if any(r.trace for r in v.records)), [])
    if not traced:
        return ('<p class="note">No run of this cell was traced (<code>parity nightly '
                "--trace</code> captures one window per cell).</p>")
    items = []
    for record in traced:
        logdir = record.trace.logdir
        commands = viewer_commands(logdir)
        where = (f'<a href="{_e(Path(logdir).as_uri())}">{_e(logdir)}</a>'
                 if Path(logdir).is_absolute() else f"<code>{_e(logdir)}</code>")
        items.append(
            f'<li>run <code>{_e(record.run_id)}</code> round {record.round}: {where}'
            f"<br><code>{_e(commands['xprof'])}</code><br>"
            f"<code>{_e(commands['tensorboard'])}</code></li>")
    return f"<ul>{''.join(items)}</ul>"


def _changes(history: CellHistory) -> str:
    if not history.changes:
        return '<p class="note">None: every run of this cell is comparable.</p>'
    rows = "".join(f"<tr><td>{_e(charts.x_time(c.time))}</td><td>{_e(c.text)}</td></tr>"
                   for c in history.changes)
    return ("<table><thead><tr><th>from (UTC)</th><th>what changed (runs on either side are "
            f"not compared)</th></tr></thead><tbody>{rows}</tbody></table>")


def _summary(history: CellHistory) -> str:
    latest = history.latest
    parts = []
    if latest is not None:
        parts.append(f"Latest run {_e(charts.x_time(latest.time))} UTC: median "
                     f"<b>{_e(median_text(latest)[0])}</b> ms/step; "
                     f"{verdict_html(latest)} <span class=\"why\">{_e(latest.why)}</span>")
    if history.latest_plan is not None:
        plan = history.latest_plan
        parts.append(f"Latest plan {_e(charts.x_time(plan.time))} UTC: {verdict_html(plan)} "
                     f'<span class="why">{_e(plan.why)}</span>')
    return "".join(f"<p>{p}</p>" for p in parts)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g}"


def roofline(history: CellHistory) -> str:
    """The latest plan's roofline (per executable call and per step), with the latest timed
    run's median beside it where that run was measured on the plan's device kind."""
    plan_view = history.latest_plan
    plan = next((r.plan for r in plan_view.records if r.plan), None) if plan_view else None
    roof = plan and plan.roofline
    if roof is None:
        return ('<p class="note">No roofline: no plan of this cell, or none for a device '
                "kind with a datasheet (harness.measure.devices).</p>")
    bounds = [(f"{name} (one call; {plan.executables[name].calls_per_step} per step)", b)
              for name, b in roof.executables.items() if plan.executables[name].calls_per_step]
    rows = "".join(
        f"<tr><td>{_e(label)}</td><td class=\"num\">{_ms(b.compute_s)}</td>"
        f'<td class="num">{_ms(b.memory_s)}</td>'
        f'<td class="num">{_ms(sum(b.collective_s.values()) if b.collective_s else None)}</td>'
        f'<td class="num"><b>{_ms(b.lower_bound_s)}</b></td><td>{_e(b.bound_by or "-")}</td>'
        "</tr>" for label, b in [*bounds, ("step", roof.step)])
    latest = history.latest
    env = latest and latest.environment
    measured = ""
    if latest and latest.median and env and env.device_kind == plan.device_kind \
            and roof.step.lower_bound_s:
        ratio = latest.median.median / (roof.step.lower_bound_s * 1e3)
        measured = (f" Measured on {_e(plan.device_kind)} (run <code>{_e(latest.run_id)}"
                    f"</code>): <b>{latest.median.median:.4g}</b> ms/step, "
                    f"<b>{ratio:.2f}x</b> the lower bound.")
    sheet = roof.datasheet
    ceiling = "-" if roof.mfu_ceiling is None else f"{roof.mfu_ceiling:.1%}"
    return (f'<p class="note">The least time a step of this program can take on '
            f"{_e(plan.target)}: the plan's FLOPs, HBM bytes and collective bytes against the "
            f"{_e(sheet.device_kind)} datasheet ({sheet.peak_flops / 1e12:g} TFLOP/s "
            f"{_e(sheet.matmul_dtype)}, {sheet.hbm_bytes_per_s / 1e9:g} GB/s HBM per device; "
            f"{_e(sheet.source)}). Not a measurement. {_e(roof.model)}.</p>"
            f"<p>MFU ceiling <b>{ceiling}</b> (model FLOPs at peak "
            f"{_ms(roof.model_compute_s)} ms / lower bound).{measured}</p>"
            "<table><thead><tr><th>per device</th><th>compute ms</th><th>memory ms</th>"
            "<th>collectives ms</th><th>lower bound ms</th><th>bound by</th></tr></thead>"
            f"<tbody>{rows}</tbody></table>")


def planned_vs_measured(history: CellHistory) -> str:
    """The latest timed run beside the plan its cells made of their own program on their
    device (a run on an accelerator: reports.measured)."""
    latest = history.latest
    found = measured.rows(to_frame(latest.records)) if latest else []
    if not found:
        return ('<p class="note">No run of this cell carries a plan of its own program '
                "(a run on an accelerator does: its fit check's plan).</p>")
    head = "".join(f"<th>{_e(h)}</th>" for h in measured.HEADER[2:])
    body = "".join("<tr>" + "".join(
        f'<td class="num">{_e(v).replace("**gap**", "<b>gap</b>")}</td>' for v in row[2:])
        + "</tr>" for row in found)
    return (f'<p class="note">{_e(measured.SITE_NOTE)}</p>'
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")


def cell(history: CellHistory) -> str:
    """A cell's page: its timing, cost and plan histories, the latest run's step times,
    its traces, the changes and a table of recent runs."""
    latest = history.latest
    metrics = ", ".join(f"{m} ({costs.METRICS[m][0] or 'count'})"
                        for m, _, _ in charts.COST_PANELS)
    return (_head(history.id.name, 1)
            + f'<nav><a href="../index.html">all cells</a> | '
              f'<a href="../{shape_href(history.id.shape)}">arms of this shape</a></nav>'
            + f"<h1>{_e(history.id.name)}</h1>" + _summary(history)
            + "<h2>Median ms/step per run</h2>"
            + '<p class="note">Median: the median of the run\'s round medians (the parity '
              "report's; the nightly table's median pools every step). Band: its 95% CI "
              "over the rounds. "
              "Triangles: the nightly's verdict against the last "
              f"{regression.BASELINE_RUNS} comparable runs (red up: regression, green down: "
              f"improvement; threshold {history.threshold:.0%}); open grey circles: not "
              "comparable (a new baseline); crosses along the bottom: failed runs. Dotted "
              "lines: environment or config changes; no run is compared across one. Hover "
              "a point for its commit, versions and verdict.</p>"
            + _figure("timing", charts.timing(history) if history.timed else None,
                      "No timed run.")
            + "<h2>Cost per step</h2>"
            + f'<p class="note">Exact figures of the compiled program ({_e(metrics)}): any '
              "increase against the latest comparable run is a regression (red triangle), a "
              "decrease is marked green.</p>"
            + _figure("cost", charts.cost(history), "No cost metrics recorded.")
            + "<h2>Plan on the target</h2>"
            + _figure("plan", charts.plan(history),
                      "No plan records (parity nightly --plan adds them).")
            + "<h3>Roofline of the latest plan</h3>" + roofline(history)
            + "<h3>Planned vs measured (the latest run's own plan)</h3>"
            + planned_vs_measured(history)
            + "<h2>Latest run: every step</h2>"
            + _figure("distribution", charts.distribution(latest) if latest else None,
                      "No finished timed run.")
            + "<h2>Latest traces</h2>" + _traces(history)
            + "<h2>Changes</h2>" + _changes(history)
            + "<h2>Runs</h2>" + _runs_table(history.timed, "Timed runs")
            + (_runs_table(history.plans, "Plan runs") if history.plans else "")
            + "</body></html>\n")


def shape(key: tuple, histories: Sequence[CellHistory]) -> str:
    """The arms of one shape side by side over time, with each arm's latest run."""
    rows = "".join(
        f'<tr><td><a href="../{cell_href(h)}">{_e(h.id.arm)}</a></td>'
        f'<td class="num">{_e(median_text(h.latest)[0])}</td>'
        f"<td>{verdict_html(h.latest)}</td>"
        f"<td>{_e(charts.x_time(h.latest.time)[:16] if h.latest else '-')}</td></tr>"
        for h in histories)
    timed = [h for h in histories if h.timed]
    return (_head(shape_name(key), 1)
            + '<nav><a href="../index.html">all cells</a></nav>'
            + f"<h1>Arms of {_e(shape_name(key))}</h1>"
            + '<p class="note">Each arm\'s median ms/step per run with its 95% CI band. Arms '
              "are not compared with each other here: the parity report's speedups (parity "
              "report) say which lead is beyond noise.</p>"
            + _figure("arms", charts.arms(timed) if timed else None, "No timed run.")
            + "<h2>Latest run of each arm</h2><table><thead><tr><th>arm</th>"
              "<th>median ms/step [95% CI]</th><th>verdict</th><th>time (UTC)</th></tr>"
              f"</thead><tbody>{rows}</tbody></table></body></html>\n")
