"""What every page of the site loads, written once into SITE/assets/: plotly.js (from the
plotly package, so the site needs no network), the style sheet and the page script.

The page script draws each page's figures (`<script type="application/json" class="figure">`
holding `{"data": ..., "layout": ...}` next to the `<div>` it belongs to) with
`Plotly.newPlot`, and makes the index table sortable (click a header) and filterable (the
arm, preset, backend and verdict selects, and free text). It writes `data-rendered` on each
chart it drew, and `window.parityErrors` lists any chart that failed, so a headless browser
can tell a drawn page from a blank one.
"""

from __future__ import annotations

from pathlib import Path

PLOTLY = "plotly.min.js"
STYLE = "site.css"
SCRIPT = "site.js"

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 1.5em 3em;
       color: #222; }
h1 { font-size: 1.35em; margin: 0.8em 0 0.3em; }
h2 { font-size: 1.1em; margin: 1.6em 0 0.4em; border-bottom: 1px solid #ddd; }
nav { margin-top: 0.8em; font-size: 0.95em; }
a { color: #1f5fa8; text-decoration: none; } a:hover { text-decoration: underline; }
table { border-collapse: collapse; font-size: 0.92em; }
th, td { padding: 3px 8px; border-bottom: 1px solid #eee; text-align: left;
         vertical-align: middle; }
th { background: #f4f4f4; position: sticky; top: 0; }
th.sortable { cursor: pointer; user-select: none; }
th.sortable::after { content: " \\2195"; color: #aaa; }
th.sorted-asc::after { content: " \\2191"; color: #222; }
th.sorted-desc::after { content: " \\2193"; color: #222; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.verdict { font-weight: 600; white-space: nowrap; }
.v-regression { color: #d62728; } .v-improvement { color: #2ca02c; }
.v-failed { color: #000; background: #fdd; padding: 0 4px; }
.v-not-comparable { color: #777; } .v-ok { color: #1f5fa8; }
.why { color: #555; font-size: 0.88em; max-width: 34em; }
.filters { margin: 0.6em 0; display: flex; gap: 1em; flex-wrap: wrap; align-items: center; }
.filters label { font-size: 0.92em; }
.chart { width: 100%; min-height: 300px; }
.note { color: #555; font-size: 0.9em; max-width: 70em; }
.spark { vertical-align: middle; }
code { font-size: 0.9em; background: #f6f6f6; padding: 0 3px; }
details { margin: 0.5em 0; }
"""

JS = r"""
"use strict";
window.parityErrors = [];
function parityDraw() {
  if (typeof Plotly === "undefined") {
    window.parityErrors.push("plotly.js did not load");
    return;
  }
  document.querySelectorAll("script.figure").forEach(function (holder) {
    var target = document.getElementById(holder.dataset.target);
    try {
      var figure = JSON.parse(holder.textContent);
      Plotly.newPlot(target, figure.data, figure.layout,
                     {responsive: true, displaylogo: false}).then(function () {
        target.dataset.rendered = String(figure.data.length);
      });
    } catch (err) {
      window.parityErrors.push(holder.dataset.target + ": " + err);
      console.error(err);
    }
  });
}
function parityTable() {
  var table = document.getElementById("cells");
  if (!table) return;
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var selects = document.querySelectorAll("select.filter");
  var text = document.getElementById("filter-text");
  function apply() {
    var shown = 0;
    rows.forEach(function (row) {
      var keep = true;
      selects.forEach(function (select) {
        if (select.value && row.dataset[select.dataset.key] !== select.value) keep = false;
      });
      if (text && text.value && row.textContent.toLowerCase().indexOf(
          text.value.toLowerCase()) < 0) keep = false;
      row.hidden = !keep;
      if (keep) shown += 1;
    });
    document.getElementById("shown").textContent = String(shown);
  }
  selects.forEach(function (select) { select.addEventListener("change", apply); });
  if (text) text.addEventListener("input", apply);
  table.querySelectorAll("th.sortable").forEach(function (th, index) {
    th.addEventListener("click", function () {
      var column = th.cellIndex;
      var ascending = !th.classList.contains("sorted-asc");
      table.querySelectorAll("th").forEach(function (h) {
        h.classList.remove("sorted-asc", "sorted-desc");
      });
      th.classList.add(ascending ? "sorted-asc" : "sorted-desc");
      var numeric = th.dataset.type === "number";
      rows.sort(function (a, b) {
        var x = a.cells[column].dataset.sort, y = b.cells[column].dataset.sort;
        if (x === undefined) x = a.cells[column].textContent;
        if (y === undefined) y = b.cells[column].textContent;
        if (numeric) {
          x = x === "" ? Infinity : parseFloat(x);
          y = y === "" ? Infinity : parseFloat(y);
          return ascending ? x - y : y - x;
        }
        return ascending ? x.localeCompare(y) : y.localeCompare(x);
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
  apply();
}
document.addEventListener("DOMContentLoaded", function () {
  parityTable();
  parityDraw();
});
"""


def plotly_js() -> str:
    """The plotly.js bundle the installed plotly package ships (no CDN, no network)."""
    from plotly.offline import get_plotlyjs

    return get_plotlyjs()


def write(directory: Path) -> None:
    """SITE/assets/: plotly.js, the style sheet and the page script."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PLOTLY).write_text(plotly_js(), encoding="utf-8")
    (directory / STYLE).write_text(CSS.lstrip(), encoding="utf-8")
    (directory / SCRIPT).write_text(JS.lstrip(), encoding="utf-8")
