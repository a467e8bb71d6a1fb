"""The published site in a real browser: headless Chromium (Debian's package, driven by
playwright; no browser download) opens index.html and a cell page from file://, with every
request that is not a file of the site refused. Asserted: no console error or page error, no
request outside file://, the charts drawn (plotly's DOM for each, with its data points), a
filter that hides the other arms' rows; screenshots are saved (to $PARITY_SCREENSHOTS as
well, where set) for a person to look at."""

import os
import shutil
from pathlib import Path

import pytest

from reports.site import writer
from reports.site.history import CellId
from tests.reports.site import synthetic

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
NIGHTS = 45
ARMS = ("engine", "engine-fused", "native")


def _browser():
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed: `apt-get install chromium` (make "
                    "test installs it when run as root)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed: pip install -e '.[test]'")
    return sync_api


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    records = synthetic.nightly_history(nights=NIGHTS, arms=ARMS, seed=7)
    out = tmp_path_factory.mktemp("browser") / "site"
    writer.publish(records, out, source="synthetic tpu7x-nightly")
    return out


@pytest.fixture(scope="module")
def browser():
    sync_api = _browser()
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()


def _open(browser, url: str):
    """A page at `url` that records console errors, page errors and any request leaving
    file:// (refused)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    seen = {"errors": [], "outside": []}
    page.on("console", lambda m: seen["errors"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            seen["outside"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(url)
    return page, seen


def _shot(page, tmp_path, name: str) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    keep = os.environ.get("PARITY_SCREENSHOTS")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(keep) / name)
    return path


def test_index_renders_sparklines_and_its_filters_work(browser, site, tmp_path):
    page, seen = _open(browser, (site / "index.html").as_uri())
    page.wait_for_selector("#cells tbody tr")
    cells = len(ARMS) * 2 * 2
    assert page.locator("#cells tbody tr").count() == cells
    points = page.eval_on_selector_all(
        "svg.spark", "svgs => svgs.map(s => s.querySelectorAll('polyline').length)")
    assert len(points) == cells and all(n >= 1 for n in points)
    assert page.locator("#shown").inner_text() == str(cells)
    _shot(page, tmp_path, "index.png")
    page.select_option("#filter-arm", "native")
    visible = page.eval_on_selector_all(
        "#cells tbody tr", "rows => rows.filter(r => !r.hidden).map(r => r.dataset.arm)")
    assert visible == ["native"] * 4
    assert page.locator("#shown").inner_text() == "4"
    page.select_option("#filter-preset", "qwen3-8b")
    assert page.locator("#shown").inner_text() == "2"
    _shot(page, tmp_path, "index-filtered.png")
    page.select_option("#filter-arm", "")
    page.select_option("#filter-preset", "")
    page.click("th:has-text('median ms/step')")  # sort ascending by the latest median
    medians = page.eval_on_selector_all(
        "#cells tbody tr", "rows => rows.map(r => parseFloat(r.cells[8].dataset.sort))")
    assert medians == sorted(medians)
    assert seen == {"errors": [], "outside": []}
    page.close()


def test_a_cell_page_draws_every_chart_with_its_points(browser, site, tmp_path):
    cid = CellId(arm="engine", preset="qwen3-8b", seq=4096, batch=32, ga=4,
                 dtype="bfloat16", mesh="fsdp=-1", backend="tpu")
    page, seen = _open(browser, (site / "cells" / f"{cid.slug}.html").as_uri())
    for target in ("timing", "cost", "plan", "distribution"):
        page.wait_for_selector(f"#{target}[data-rendered]", timeout=30_000)
    drawn = page.evaluate("""() => Object.fromEntries(
        ['timing', 'cost', 'plan', 'distribution'].map(id => {
          const gd = document.getElementById(id);
          return [id, {traces: gd.data.length,
                       values: gd.data.map(t => (t.y || []).filter(v => v !== null).length),
                       svgPoints: gd.querySelectorAll('.scatterlayer .point, .boxlayer .point')
                                    .length,
                       lines: gd.querySelectorAll('.scatterlayer .js-line').length}];
        }))""")
    timing = drawn["timing"]
    assert NIGHTS in timing["values"]  # the median trace: one point a night
    assert timing["svgPoints"] >= NIGHTS and timing["lines"] >= 1
    assert drawn["cost"]["lines"] >= 4 and drawn["plan"]["lines"] >= 3
    assert drawn["distribution"]["svgPoints"] == synthetic.ROUNDS * synthetic.STEPS
    regression = page.evaluate(
        "() => document.getElementById('timing').data.find(t => t.name === 'regression')")
    assert regression is not None and len(regression["x"]) >= 1
    changes = page.evaluate("() => document.getElementById('timing').layout.shapes.length")
    assert changes >= 3  # libtpu, jax, XLA flags
    assert page.evaluate("window.parityErrors") == []
    _shot(page, tmp_path, "cell.png")
    assert seen == {"errors": [], "outside": []}
    page.close()


def test_a_shape_page_draws_every_arm(browser, site, tmp_path):
    shape = CellId(arm="x", preset="qwen3-1.7b", seq=4096, batch=32, ga=1,
                   dtype="bfloat16", mesh="fsdp=-1", backend="tpu")
    from reports.site import pages

    page, seen = _open(browser, (site / pages.shape_href(shape.shape)).as_uri())
    page.wait_for_selector("#arms[data-rendered]", timeout=30_000)
    names = page.evaluate("() => document.getElementById('arms').data"
                          ".filter(t => t.mode === 'lines' && !t.name.includes('CI'))"
                          ".map(t => t.name)")
    assert sorted(names) == sorted(ARMS)
    _shot(page, tmp_path, "shape.png")
    assert seen == {"errors": [], "outside": []}
    page.close()
