"""The site's pages and charts from a small synthetic history: every figure is valid for
plotly's own schema, the charts hold the runs' numbers and marks, the pages link up, and the
site loads nothing from the network."""

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from reports.site import charts, history, pages, writer
from tests.reports.site import synthetic

NIGHTS = 30


@pytest.fixture(scope="module")
def records():
    return synthetic.nightly_history(nights=NIGHTS, arms=("engine", "native"),
                                     presets=("qwen3-8b",), gas=(1, 4), seed=2)


@pytest.fixture(scope="module")
def site(records, tmp_path_factory):
    out = tmp_path_factory.mktemp("site") / "site"
    done = writer.publish(records, out, source="synthetic")
    return out, done


def _figures(page: Path) -> dict[str, dict]:
    text = page.read_text()
    found = re.findall(r'<script type="application/json" class="figure" '
                       r'data-target="([a-z]+)">(.*?)</script>', text, re.S)
    return {target: json.loads(body) for target, body in found}


def test_the_site_has_an_index_a_page_per_cell_and_shape_and_plotly_once(site):
    out, done = site
    assert done.cells == 4 and done.shapes == 2
    assert sorted(p.name for p in out.iterdir()) == [".parity-site", "assets", "cells",
                                                       "index.html", "shapes"]
    assert len(list((out / "cells").iterdir())) == 4
    assert len(list((out / "shapes").iterdir())) == 2
    bundle = (out / "assets" / "plotly.min.js").read_text()
    assert len(bundle) > 1_000_000 and "plotly" in bundle[:2000].lower()
    assert done.index_bytes == (out / "index.html").stat().st_size


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for name in ("href", "src"):
            if attrs.get(name):
                self.links.append(attrs[name])


def test_every_link_resolves_inside_the_site_and_nothing_comes_from_the_network(site):
    out, _ = site
    for page in out.rglob("*.html"):
        parser = _Links()
        parser.feed(page.read_text())
        for link in parser.links:
            if link.startswith("file://"):  # a trace directory, outside the site
                continue
            assert "://" not in link and not link.startswith("//"), (page, link)
            assert (page.parent / link).resolve().exists(), (page, link)
        assert "http://" not in page.read_text().replace("http://localhost", "")
        assert "https://" not in page.read_text()


def test_figures_are_valid_plotly_figures(site):
    go = pytest.importorskip("plotly.graph_objects")
    out, _ = site
    checked = 0
    for page in [*out.glob("cells/*.html"), *out.glob("shapes/*.html")]:
        for figure in _figures(page).values():
            go.Figure(figure)  # raises on any property plotly does not know
            checked += 1
    assert checked == 4 * 4 + 2  # timing, cost, plan, distribution; arms per shape


def test_the_cell_page_draws_each_run_and_marks_the_planted_regression(records, site):
    out, _ = site
    cid = history.CellId(arm="engine", preset="qwen3-8b", seq=4096, batch=32, ga=4,
                         dtype="bfloat16", mesh="fsdp=-1", backend="tpu")
    figures = _figures(out / "cells" / f"{cid.slug}.html")
    median = next(t for t in figures["timing"]["data"] if t["name"] == "median ms/step")
    assert len(median["x"]) == NIGHTS and all(y > 0 for y in median["y"])
    slow = synthetic.events(NIGHTS)[0]
    regression = next(t for t in figures["timing"]["data"] if t["name"] == "regression")
    night = synthetic.START.strftime("%Y-%m-") + f"{1 + slow.start:02d}"
    assert any(x.startswith(night) for x in regression["x"]), regression["x"]
    # The CI band is the runs' median CI (reports.medians.median_ci) at every run.
    high = next(t for t in figures["timing"]["data"] if t["name"] == "median CI high")
    assert all(h >= m for h, m in zip(high["y"], median["y"], strict=True))
    # Environment changes: one dotted line each, across the whole figure.
    shapes = figures["timing"]["layout"]["shapes"]
    assert len(shapes) == len(history.cell_history(
        cid, [r for r in records if history.cell_id(r) == cid], threshold=0.05).changes)
    assert all(s["yref"] == "paper" and s["line"]["dash"] == "dot" for s in shapes)
    # Cost panels: bytes accessed steps up at the regression and back down at the fix.
    cost = figures["cost"]["data"]
    up = next(t for t in cost if t["name"] == "bytes accessed/step up")
    assert len(up["x"]) == 1 and up["x"][0].startswith(night)
    assert any(t["name"] == "bytes accessed/step down" for t in cost)
    plan = [t["name"] for t in figures["plan"]["data"]]
    assert {"planned peak/device (B)", "HBM bytes/step/device",
            "collective bytes/step/device"} <= set(plan)
    boxes = figures["distribution"]["data"]
    assert [len(b["y"]) for b in boxes] == [synthetic.STEPS] * synthetic.ROUNDS
    # The latest traces: the capture's directory as a file:// link and both viewers' commands.
    traced = next(r for r in records if history.cell_id(r) == cid and r.trace)
    text = (out / "cells" / f"{cid.slug}.html").read_text()
    assert f'href="file://{traced.trace.logdir}"' in text
    assert f"xprof --logdir {traced.trace.logdir} --port 8791" in text


def test_the_cell_page_puts_the_latest_run_beside_its_plans_roofline(records, site):
    """The roofline of the cell's latest plan, per call and per step, and the latest run
    measured on the plan's device kind as a multiple of the step's lower bound."""
    out, _ = site
    cid = history.CellId(arm="native", preset="qwen3-8b", seq=4096, batch=32, ga=1,
                         dtype="bfloat16", mesh="fsdp=-1", backend="tpu")
    cell = history.cell_history(cid, [r for r in records if history.cell_id(r) == cid],
                                threshold=0.05)
    roof = cell.latest_plan.records[0].plan.roofline
    bound_ms = roof.step.lower_bound_s * 1e3
    text = (out / "cells" / f"{cid.slug}.html").read_text()
    section = text.split("<h3>Roofline of the latest plan</h3>")[1].split("<h2>")[0]
    assert f"MFU ceiling <b>{roof.mfu_ceiling:.1%}</b>" in section
    assert "<td>step</td>" in section and f"<b>{bound_ms:.3g}</b>" in section
    median = cell.latest.median.median
    assert f"<b>{median:.4g}</b> ms/step, <b>{median / bound_ms:.2f}x</b> the lower bound" \
        in section
    assert "Not a measurement" in section and "cloud.google.com/tpu/docs/tpu7x" in section


def test_the_index_has_one_filterable_row_per_cell_with_its_latest_median(records, site):
    out, _ = site
    text = (out / "index.html").read_text()
    rows = re.findall(r'<tr data-arm="([^"]+)" data-preset="([^"]+)" data-backend="([^"]+)"',
                      text)
    assert sorted(rows) == sorted([(a, "qwen3-8b", "tpu") for a in ("engine", "native")] * 2)
    assert text.count('class="spark"') == 4
    assert 'id="filter-arm"' in text and 'id="filter-preset"' in text
    assert 'id="filter-backend"' in text
    for h in writer.build(records):
        median, _ = pages.median_text(h.latest)
        assert median in text


def test_sparkline_gaps_at_failed_runs_and_dots_verdicts():
    records = synthetic.nightly_history(nights=20, arms=("peft-maxtext",),
                                        presets=("qwen3-8b",), gas=(4,), plans=False)
    (h,) = writer.build(records)
    svg = charts.sparkline(h.timed)
    assert svg.count("<polyline") == 2  # the failed night cuts the line
    assert f'data-points="{sum(v.median is not None for v in h.timed)}"' in svg
