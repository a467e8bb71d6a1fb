"""The dashboard's charts as plotly figures (plain `{"data": [...], "layout": {...}}` dicts,
drawn in the browser by plotly.js with `Plotly.newPlot`), and the index's SVG sparklines.

Every number drawn comes from `reports.site.history` (which takes it from `reports.stats`,
`reports.regression` and `reports.costs`); these functions only lay it out. x is the run's
time (UTC). Vertical dotted lines mark the changes after which records are not compared with
those before (environment, config). Figures are plain dicts so that a year of runs
serializes fast; the tests check each against plotly's own schema.
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence

from reports.site.history import (
    BROKEN,
    IMPROVED,
    NOT_COMPARABLE,
    REGRESSED,
    CellHistory,
    Change,
    RunView,
)

COLOURS = {REGRESSED: "#d62728", IMPROVED: "#2ca02c", NOT_COMPARABLE: "#7f7f7f",
           BROKEN: "#000000"}
MARKERS = {REGRESSED: "triangle-up", IMPROVED: "triangle-down", NOT_COMPARABLE: "circle-open",
           BROKEN: "x"}
ARM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
               "#bcbd22", "#7f7f7f", "#d62728")
VERSIONS_SHOWN = ("jax", "jaxlib", "libtpu", "maxtext", "flax", "google-tunix")
COST_PANELS = (
    ("compiled_flops_per_step", "compiled FLOP/step", "FLOP"),
    ("bytes_accessed_per_step", "bytes accessed/step", "B"),
    ("planned_peak_bytes", "planned peak (B)", "B"),
    ("executions_per_step", "executions/step", ""),
)
"""(cost metric, panel title, unit) of the cost chart (reports.costs.METRICS names). Values
are drawn as recorded, ticks in SI prefixes (k, M, G, T: powers of 1000)."""
PLAN_PANELS = (
    ("plan_peak_bytes", "planned peak/device (B)", "B"),
    ("plan_hbm_bytes_per_step", "HBM bytes/step/device", "B"),
    ("plan_collective_bytes_per_step", "collective bytes/step/device", "B"),
)


def amount(value: float | None, unit: str) -> str:
    """A cost figure for a hover: bytes in binary units (MiB, GiB), FLOPs in SI (GFLOP),
    counts as they are."""
    if value is None:
        return "-"
    if unit == "B":
        for size, name in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= size:
                return f"{value / size:.5g} {name} ({value:.0f} B)"
        return f"{value:.0f} B"
    if unit == "FLOP":
        return f"{value / 1e9:.6g} GFLOP"
    return f"{value:g}"


def x_time(iso: str) -> str:
    """A record's ISO timestamp as plotly's date string, in UTC ('YYYY-MM-DD HH:MM:SS')."""
    try:
        when = datetime.datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if when.tzinfo is not None:
        when = when.astimezone(datetime.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S")


def _ci(view: RunView) -> str:
    m = view.median
    if m is None:
        return "-"
    if m.low is None:
        return f"{m.median:.2f} ms (CI needs {3}+ rounds; {m.runs} ran)"
    return f"{m.median:.2f} ms [{m.low:.2f}, {m.high:.2f}] ({m.runs} rounds)"


def hover(view: RunView) -> str:
    """A run's hover text: when, which commit and versions, its median and verdict."""
    env = view.environment
    versions = ""
    if env is not None:
        versions = ", ".join(f"{k} {env.versions[k]}" for k in VERSIONS_SHOWN
                             if env.versions.get(k))
    lines = [f"<b>{html.escape(view.run_id)}</b> ({x_time(view.time)} UTC)",
             f"commit {html.escape(view.code)}",
             html.escape(versions), f"median {_ci(view)}",
             f"<b>{view.verdict}</b>: {html.escape(_wrap(view.why))}"]
    return "<br>".join(line for line in lines if line)


def short_hover(view: RunView) -> str:
    """A run in one line: when, which commit, its verdict (the timing chart has the rest)."""
    return (f"{x_time(view.time)} UTC, commit {html.escape(view.code)}: "
            f"{view.verdict}")


def _wrap(text: str, width: int = 90) -> str:
    """Long lines broken for a hover box (plotly does not wrap)."""
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + len(word) > width:
            lines.append(line)
            line = ""
        line = f"{line} {word}" if line else word
    return "<br>".join([*lines, line])


def change_marks(changes: Sequence[Change]) -> tuple[list[dict], list[dict]]:
    """Vertical dotted lines over the whole figure at each change, each labelled at the top
    with the full text on hover."""
    shapes, notes = [], []
    for change in changes:
        x = x_time(change.time)
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": x, "x1": x,
                       "y0": 0, "y1": 1, "line": {"color": "#555", "width": 1,
                                                  "dash": "dot"}})
        notes.append({"x": x, "xref": "x", "y": 1, "yref": "paper", "yanchor": "bottom",
                      "text": "env" if "->" in change.text else "change", "showarrow": False,
                      "font": {"size": 10, "color": "#555"},
                      "hovertext": html.escape(_wrap(change.text))})
    return shapes, notes


def _layout(title: str, changes: Sequence[Change], **extra) -> dict:
    shapes, notes = change_marks(changes)
    return {"title": {"text": title, "font": {"size": 14}}, "hovermode": "closest",
            "margin": {"l": 70, "r": 20, "t": 60, "b": 60}, "shapes": shapes,
            "annotations": notes, "legend": {"orientation": "h", "y": -0.25},
            "xaxis": {"type": "date", "title": {"text": "run time (UTC)"}}, **extra}


def _marked(views: Sequence[RunView], y: list, verdict: str, yaxis: str = "y") -> dict | None:
    picked = [(x_time(v.time), value, hover(v)) for v, value in zip(views, y, strict=True)
              if v.verdict == verdict and value is not None]
    if not picked:
        return None
    xs, ys, texts = zip(*picked, strict=True)
    return {"type": "scatter", "mode": "markers", "name": verdict, "x": list(xs),
            "y": list(ys), "yaxis": yaxis, "hovertext": list(texts), "hoverinfo": "text",
            "marker": {"symbol": MARKERS[verdict], "size": 11, "color": COLOURS[verdict],
                       "line": {"width": 1, "color": COLOURS[verdict]}}}


def band(views: Sequence[RunView], colour: str, name: str, group: str) -> list[dict]:
    """The run-level 95% CI of each run's median as a filled band (upper edge, then lower
    edge filled up to it); gaps where a run has no CI."""
    xs = [x_time(v.time) for v in views]
    high = [v.median.high if v.median else None for v in views]
    low = [v.median.low if v.median else None for v in views]
    edge = {"type": "scatter", "mode": "lines", "x": xs, "line": {"width": 0, "color": colour},
            "hoverinfo": "skip", "showlegend": False, "legendgroup": group}
    return [{**edge, "y": high, "name": f"{name} CI high"},
            {**edge, "y": low, "name": f"{name} 95% CI", "fill": "tonexty",
             "fillcolor": _alpha(colour, 0.2), "showlegend": True}]


def _alpha(colour: str, alpha: float) -> str:
    r, g, b = (int(colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def timing(history: CellHistory) -> dict:
    """Median ms/step per run with its 95% CI band; regressions, improvements and new
    baselines marked on the median, failed runs as crosses along the bottom."""
    views = history.timed
    medians = [v.median.median if v.median else None for v in views]
    data = [*band(views, ARM_COLOURS[0], "median", "median"),
            {"type": "scatter", "mode": "lines+markers", "name": "median ms/step",
             "x": [x_time(v.time) for v in views], "y": medians,
             "hovertext": [hover(v) for v in views], "hoverinfo": "text",
             "line": {"color": ARM_COLOURS[0], "width": 1.5}, "marker": {"size": 4},
             "legendgroup": "median"}]
    data += [t for verdict in (REGRESSED, IMPROVED, NOT_COMPARABLE)
             if (t := _marked(views, medians, verdict)) is not None]
    failed = [v for v in views if v.verdict == BROKEN]
    if failed:
        data.append({"type": "scatter", "mode": "markers", "name": BROKEN,
                     "x": [x_time(v.time) for v in failed], "y": [0.03] * len(failed),
                     "yaxis": "y2", "hovertext": [hover(v) for v in failed],
                     "hoverinfo": "text", "marker": {"symbol": "x", "size": 10,
                                                     "color": COLOURS[BROKEN]}})
    return {"data": data, "layout": _layout(
        f"{history.id.name}: median ms/step per run, 95% CI band (over rounds)",
        history.changes, yaxis={"title": {"text": "ms / step"}},
        yaxis2={"overlaying": "y", "range": [0, 1], "visible": False, "fixedrange": True})}


def _panels(views: Sequence[RunView], panels, title: str, changes: Sequence[Change]) -> dict:
    """One step line per metric, stacked panels sharing the time axis; a metric's increase
    (exact, vs the latest comparable run) marked red on its panel, a decrease green."""
    shown = [(metric, label, unit) for metric, label, unit in panels
             if any(v.cost.get(metric) is not None for v in views)]
    data, layout_axes = [], {}
    xs = [x_time(v.time) for v in views]
    for i, (metric, label, unit) in enumerate(shown, 1):
        axis = "y" if i == 1 else f"y{i}"
        ys = [v.cost.get(metric) for v in views]
        data.append({"type": "scatter", "mode": "lines", "line": {"shape": "hv", "width": 2},
                     "name": label, "x": xs, "y": ys, "yaxis": axis,
                     "hovertext": [f"{label}: {amount(y, unit)}<br>{short_hover(v)}"
                                   for v, y in zip(views, ys, strict=True)],
                     "hoverinfo": "text"})
        for increase, colour, symbol in ((True, COLOURS[REGRESSED], "triangle-up"),
                                         (False, COLOURS[IMPROVED], "triangle-down")):
            hits = [(x, y) for v, x, y in zip(views, xs, ys, strict=True)
                    if y is not None and _changed(v, metric, increase)]
            if hits:
                data.append({"type": "scatter", "mode": "markers", "x": [h[0] for h in hits],
                             "y": [h[1] for h in hits], "yaxis": axis, "hoverinfo": "skip",
                             "name": f"{label} {'up' if increase else 'down'}",
                             "showlegend": False,
                             "marker": {"symbol": symbol, "size": 11, "color": colour}})
        layout_axes[f"yaxis{'' if i == 1 else i}"] = _cost_axis(label, unit, ys)
    layout = _layout(title, changes, height=max(260, 190 * len(shown)),
                     grid={"rows": max(len(shown), 1), "columns": 1, "pattern": "coupled",
                           "roworder": "top to bottom"}, showlegend=False, **layout_axes)
    return {"data": data, "layout": layout}


def _cost_axis(label: str, unit: str, ys: list) -> dict:
    """A cost panel's y axis: from 0 to 30% above the largest value (a constant line stays
    inside its panel), ticks in SI prefixes, whole ticks for counts."""
    top = max((y for y in ys if y is not None), default=0) or 1
    axis = {"title": {"text": label, "font": {"size": 11}}, "range": [0, top * 1.3],
            "tickformat": ".4~s"}
    if not unit:  # a count: whole ticks
        axis.update(tickformat="d", dtick=max(1, round(top / 4)))
    return axis


def _changed(view: RunView, metric: str, increase: bool) -> bool:
    c = view.comparison
    return c is not None and any(ch.metric == metric and ch.old is not None
                                 and ch.new is not None and (ch.new > ch.old) == increase
                                 for ch in c.cost_changes)


def cost(history: CellHistory) -> dict | None:
    """The exact cost metrics per timed run as step lines; None when no run has any."""
    if not any(v.cost.get(m) is not None for v in history.timed for m, _, _ in COST_PANELS):
        return None
    return _panels(history.timed, COST_PANELS, "Cost per step (exact: compiled program, "
                   "not timed)", history.changes)


def plan(history: CellHistory) -> dict | None:
    """The plan's figures per plan run (per device, for the target); None without plans."""
    if not any(v.cost.get(m) is not None for v in history.plans for m, _, _ in PLAN_PANELS):
        return None
    target = next((r.run.plan_target for v in history.plans for r in v.records if r.run), "")
    return _panels(history.plans, PLAN_PANELS, f"Plan on {target} (XLA's plan, compiled "
                   "without the chips; per device)", history.changes)


def distribution(view: RunView) -> dict | None:
    """Every timed step of the run, one box with its points per round (process)."""
    rounds = [r for r in view.records if r.ok and r.timing and r.timing.step_ms]
    if not rounds:
        return None
    data = [{"type": "box", "name": f"round {r.round}", "y": r.timing.step_ms,
             "boxpoints": "all", "jitter": 0.4, "pointpos": 0, "marker": {"size": 4},
             "line": {"width": 1}, "hoverinfo": "y"} for r in rounds]
    return {"data": data, "layout": {
        "title": {"text": f"Step times of the latest run {view.run_id} "
                          f"({x_time(view.time)} UTC), per round", "font": {"size": 14}},
        "yaxis": {"title": {"text": "ms / step"}}, "showlegend": False,
        "margin": {"l": 70, "r": 20, "t": 50, "b": 40}}}


def arms(histories: Sequence[CellHistory]) -> dict:
    """Arms of one shape side by side: each arm's median ms/step per run with its CI band,
    regressions marked: who is fastest over time."""
    data, changes = [], []
    for i, history in enumerate(histories):
        colour = ARM_COLOURS[i % len(ARM_COLOURS)]
        views = history.timed
        medians = [v.median.median if v.median else None for v in views]
        arm = history.id.arm
        data += band(views, colour, arm, arm)
        data.append({"type": "scatter", "mode": "lines", "name": arm, "legendgroup": arm,
                     "x": [x_time(v.time) for v in views], "y": medians,
                     "hovertext": [f"<b>{html.escape(arm)}</b><br>{hover(v)}" for v in views],
                     "hoverinfo": "text", "line": {"color": colour, "width": 1.5}})
        marked = _marked(views, medians, REGRESSED)
        if marked:
            data.append({**marked, "name": f"{arm} regression", "legendgroup": arm,
                         "showlegend": False})
        changes += [c for c in history.changes if c not in changes]
    changes.sort(key=lambda c: c.time)
    title = "median ms/step per run by arm (95% CI bands); lower is faster"
    return {"data": data, "layout": _layout(title, changes, height=520,
                                            yaxis={"title": {"text": "ms / step"}})}


def sparkline(views: Sequence[RunView], width: int = 140, height: int = 28) -> str:
    """An inline SVG of the runs' medians (a line, gaps at failed runs), regressions as red
    dots, the latest as a dark dot; '' without a median."""
    points = [(i, v.median.median if v.median else None, v.verdict)
              for i, v in enumerate(views)]
    values = [p[1] for p in points if p[1] is not None]
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    step = (width - 6) / max(len(points) - 1, 1)

    def xy(i, value):
        return 3 + i * step, height - 3 - (value - low) / span * (height - 6)

    segments, current, dots = [], [], []
    for i, value, verdict in points:
        if value is None:
            if current:
                segments.append(current)
            current = []
            continue
        x, y = xy(i, value)
        current.append(f"{x:.1f},{y:.1f}")
        if verdict in (REGRESSED, IMPROVED):
            dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" '
                        f'fill="{COLOURS[verdict]}"/>')
    if current:
        segments.append(current)
    last = next(((i, v) for i, v, _ in reversed(points) if v is not None))
    lx, ly = xy(*last)
    lines = "".join(f'<polyline points="{" ".join(s)}"/>' for s in segments)
    title = (f"last {len(points)} runs: {low:.4g}-{high:.4g} ms/step"
             f"{'; red: regression, green: improvement' if dots else ''}")
    return (f'<svg class="spark" width="{width}" height="{height}" '
            f'data-points="{len(values)}" role="img"><title>{html.escape(title)}</title>'
            f'<g fill="none" stroke="#1f77b4" stroke-width="1.2">{lines}</g>{"".join(dots)}'
            f'<circle cx="{lx:.1f}" cy="{ly:.1f}" r="2" fill="#333"/></svg>')
