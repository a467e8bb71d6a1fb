"""`parity publish HISTORY -o SITE` and `parity nightly --publish SITE`: bad input is one
line and exit 2 with nothing written (an old site intact), a republish replaces the site
whole, a stop midway leaves the old site; end to end, nightly on real CPU runs marks a
planted slowdown on its cell's page."""

import json
import re
import subprocess
import sys

import pytest

from harness.cli import main
from reports.record import read_dir
from reports.site import writer
from reports.site.history import CellId
from tests.harness.cli_helpers import cli_env
from tests.harness.jobs.test_regression import CELL
from tests.reports.site import synthetic


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    records = synthetic.nightly_history(nights=8, arms=("native",), presets=("qwen3-8b",),
                                        gas=(1,), seed=5)
    return synthetic.write(records, tmp_path_factory.mktemp("history") / "history")


def _tree(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def test_publish_writes_the_site_and_says_where(history, tmp_path, capsys):
    out = tmp_path / "a" / "site"
    assert main(["publish", str(history), "-o", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"site: {out}/index.html (1 cells, 16 runs, 1 shapes; index ")
    assert (out / "index.html").is_file() and (out / writer.MARKER).is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no staging dir left
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["site"]


def _bad_inputs(tmp_path, history):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "run.jsonl").write_text("")
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    first = sorted(history.glob("*.jsonl"))[0]
    (corrupt / first.name).write_text(first.read_text() + '{"schema": 4, "cut\n')
    afile = tmp_path / "afile"
    afile.write_text("keep me")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("not a site")
    ok = str(tmp_path / "site")
    lines = len(first.read_text().splitlines())
    return [
        (["publish", str(tmp_path / "missing"), "-o", ok],
         f"parity: error: {tmp_path / 'missing'}: no such results directory or file"),
        (["publish", str(empty), "-o", ok],
         f"parity: error: {empty}: no records (no non-empty *.jsonl files); run "
         "`parity run ... --out DIR` first"),
        (["publish", str(corrupt), "-o", ok],  # json's own words for the error between
         f"parity: error: {corrupt / first.name}:{lines + 1}: not valid JSON (...); the "
         "file is corrupt or was cut off: delete that line or re-run"),
        (["publish", str(history), "-o", str(afile)],
         f"parity: error: -o {afile} is a file; give a directory for the site"),
        (["publish", str(history), "-o", str(mine)],
         f"parity: error: -o {mine} is a directory parity publish did not write (no "
         ".parity-site in it); give a new or empty directory"),
        (["publish", str(history), "-o", "/proc/parity-site"],
         "parity: error: -o /proc/parity-site: cannot write in /proc (...); give a "
         "writable directory"),
        (["publish", str(history), "-o", ok, "--threshold", "1.5"],
         "parity: error: --threshold 1.5: give a fraction, e.g. 0.05"),
    ]


def test_bad_input_is_one_line_exit_2_and_nothing_written(history, tmp_path, capsys):
    cases = _bad_inputs(tmp_path, history)
    before = _tree(tmp_path)
    for argv, message in cases:
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2, argv
        if "(...)" in message:
            head, tail = message.split("(...)")
            assert err.startswith(head + "(") and err.endswith(")" + tail + "\n"), err
        else:
            assert err == message + "\n", err
        assert err.count("\n") == 1
        assert _tree(tmp_path) == before, argv  # nothing written, nothing removed
        assert not (tmp_path / "site").exists()


def test_an_old_site_survives_bad_input_and_a_stop_and_is_replaced_whole(history, tmp_path,
                                                                        monkeypatch, capsys):
    from reports.site import pages

    out = tmp_path / "site"
    assert main(["publish", str(history), "-o", str(out)]) == 0
    (out / "stale.html").write_text("from an older publish")
    old = _tree(out)
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "r.jsonl").write_text("not json\n")
    assert main(["publish", str(corrupt), "-o", str(out)]) == 2
    assert _tree(out) == old

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(pages, "shape", interrupted)  # after every cell page was written
    assert main(["publish", str(history), "-o", str(out)]) == 130
    assert _tree(out) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt", "site"]
    monkeypatch.undo()
    capsys.readouterr()
    assert main(["publish", str(history), "-o", str(out)]) == 0
    assert not (out / "stale.html").exists()  # replaced whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corrupt", "site"]


def test_a_site_that_cannot_be_written_after_the_run_makes_it_broken_not_silent(history,
                                                                             tmp_path):
    """nightly checks --publish before the grid; should the site still fail after it (e.g.
    a file put there meanwhile), the summary is kept and the run exits 2, saying why."""
    from harness.jobs import nightly

    records = read_dir(history)
    last = max(r.run_id for r in records if not (r.run and r.run.plan_target))
    blocked = tmp_path / "site"
    blocked.write_text("")
    code, text = nightly.evaluate([r for r in records if r.run_id == last], history,
                                  threshold=0.05, report_dir=tmp_path / "report",
                                  publish_to=blocked)
    assert code == nightly.EXIT_BROKEN
    assert text.startswith("# Nightly parity")
    assert text.endswith(f"parity: error: the site was not published (--publish {blocked} is "
                         "a file; give a directory for the site)\n")
    code, text = nightly.evaluate([r for r in records if r.run_id == last], history,
                                  threshold=0.05, report_dir=tmp_path / "report",
                                  publish_to=tmp_path / "good")
    assert code == nightly.EXIT_OK and f"site: {tmp_path / 'good'}/index.html" in text


def test_nightly_refuses_a_publish_path_that_is_a_file_before_running(tmp_path):
    afile = tmp_path / "site"
    afile.write_text("")
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "nightly", *CELL,
                           "--history", str(tmp_path / "h"), "--publish", str(afile)],
                          env=cli_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"parity: error: --publish {afile} is a file; give a directory " \
                          "for the site\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["site"]  # no history written


def _nightly(history, site, **env):
    return subprocess.run([sys.executable, "-m", "harness.cli", "nightly", *CELL, "--plugin",
                           "tests.harness.fault_arms", "--history", str(history),
                           "--publish", str(site)],
                          env=cli_env(**env), capture_output=True, text=True, timeout=600)


def _page_figure(site, target="timing"):
    (page,) = (site / "cells").glob("native-tiny-*.html")
    found = re.search(rf'data-target="{target}">(.*?)</script>', page.read_text(), re.S)
    return json.loads(found.group(1))


@pytest.mark.slow
def test_nightly_publish_marks_a_planted_slowdown_on_its_cells_page(tmp_path):
    """A real CPU night of the tiny cell (the baseline), then a second with every native
    step slowed by 2x its own time (PARITY_TEST_SLOWDOWN=2.0): the site after the second
    marks that run, and only it, as a regression on the cell's page, at its time.

    Only the planted slowdown is compared: two unslowed nights on a loaded 2-core box can
    differ by 50% or more, which the rule rightly calls slower, so a test that needed them
    to agree would be a timed test with a race."""
    history, site = tmp_path / "history", tmp_path / "site"
    proc = _nightly(history, site)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "first run (baseline)" in proc.stdout
    assert f"site: {site}/index.html (1 cells, 1 runs" in proc.stdout
    proc = _nightly(history, site, PARITY_TEST_SLOWDOWN="2.0")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"site: {site}/index.html (1 cells, 2 runs" in proc.stdout
    print(proc.stdout)
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| native"))
    assert "| regression |" in row
    records = read_dir(history)
    slowed = max({r.run_id for r in records})
    slowed_time = min(r.timestamp for r in records if r.run_id == slowed)
    figure = _page_figure(site)
    marked = next(t for t in figure["data"] if t["name"] == "regression")
    assert len(marked["x"]) == 1 and marked["x"][0] == slowed_time.replace("T", " ")[:19]
    # The site's verdict is the one nightly printed: the same ratio and CI.
    ratio_ci = row.split("|")[6].strip()  # e.g. '2.736 [1.819, 4.796]'
    assert f"slower: {ratio_ci.replace(' [', 'x [')}" in marked["hovertext"][0], (
        ratio_ci, marked["hovertext"][0])
    index = (site / "index.html").read_text()
    assert 'data-verdict="regression"' in index
    cid = CellId(arm="native", preset="tiny", seq=128, batch=8, ga=1, dtype="float32",
                 mesh="1", backend="cpu")
    assert f'href="cells/{cid.slug}.html"' in index
