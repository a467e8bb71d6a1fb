"""Golden test: a checked-in results file -> the checked-in markdown; the summary comes first,
the details are folded, images are linked beside the document or embedded in it."""

import base64
import io
import re
import shutil

import numpy as np
import pytest
from PIL import Image

from reports.document import render
from reports.frame import to_frame
from reports.plots import DPI
from reports.record import ResultsError, read_dir
from tests.reports.helpers import FIXTURES, RESULTS, fixture_records, write

SNAPSHOT = FIXTURES / "parity.md"
IMAGES = ("speedup.png", "step_times.png", "sweep.png", "memory.png")


def test_fixture_renders_exactly_the_snapshot(tmp_path):
    # No baseline given: peft-decoder, first of the preference order, fails parity at GA 2
    # (mean of micro-batch means), so native, the next, is the baseline.
    text = render(RESULTS, tmp_path / "parity.md")
    assert text == SNAPSHOT.read_text()
    # Every traced cell's row gives the command that opens its capture.
    traced = [r for r in read_dir(RESULTS) if r.ok and r.trace]
    assert len(traced) == 12
    for record in traced:
        assert f"`xprof --logdir {record.trace.logdir} --port 8791`" in text
    for name in IMAGES:
        assert f"]({name})" in text  # relative links
        image = Image.open(tmp_path / name)
        image.load()
        assert image.info["Title"] and min(image.info["dpi"]) >= DPI - 0.5
        assert np.asarray(image.convert("L")).std() > 0  # not a blank canvas


def test_the_summary_comes_first_and_every_detail_is_folded():
    text = SNAPSHOT.read_text()
    assert text.index("### Summary") < text.index("<details>")
    # peft-decoder fails parity at GA 2 (mean of micro-batch means): native is the baseline.
    assert "Baseline: **native** (the first arm present that passes gradient parity" in text
    # GitHub renders markdown inside <details> only after a blank line.
    after_summary = re.findall(r"<details><summary>.*?</summary>\n(\n?)", text)
    assert len(after_summary) == text.count("<details>")
    assert set(after_summary) == {"\n"}
    assert text.count("<details>") == text.count("</details>") >= 10
    assert "### ms/step" not in text  # the old unfolded headings are gone


def test_failed_cells_are_listed_not_dropped():
    df = to_frame(read_dir(RESULTS))
    failed = df[df["status"] != "ok"]
    assert len(failed) >= 1
    text = SNAPSHOT.read_text()
    for _, row in failed.iterrows():
        assert f"| {row['arm']} | {row['error_reason']} |" in text


def test_embedded_images_are_data_uris_and_nothing_is_written_beside(tmp_path):
    out = tmp_path / "doc" / "parity.md"
    text = render(RESULTS, out, embed_images=True)
    assert sorted(p.name for p in out.parent.iterdir()) == ["parity.md"]
    assert not re.search(r"\]\((?!data:)[^)]*\.png\)", text)  # no relative image links
    uris = re.findall(r"!\[[^\]]*\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", text)
    assert len(uris) == len(IMAGES)
    for data in uris:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.load()
        assert image.format == "PNG" and image.info["Title"]


def test_without_peft_arms_the_report_needs_no_baseline_flag(tmp_path):
    # What `parity run --arms engine,native` leaves: native is the default baseline.
    results = write(fixture_records(("engine", "native")), tmp_path / "r" / "run.jsonl")
    text = render(results.parent, tmp_path / "parity.md")
    assert "Baseline: **native** (the first arm present that passes gradient parity in " \
           "every cell, of peft-maxtext, peft-decoder, native" in text
    assert "speedup vs native [95% CI]" in text
    assert "speedup vs native |" not in text.split("### Summary")[1].split("<details>")[0]


def test_the_baseline_flag_overrides_the_order(tmp_path):
    text = render(RESULTS, tmp_path / "parity.md", baseline_arm="engine")
    assert "Baseline: **engine** (chosen with `--baseline-arm`)" in text
    assert "|  | engine | 3.2 | 1.00x (baseline) |" in text
    assert "planned vs engine" in text


def test_environments_that_differ_get_separate_sections(tmp_path):
    lines = RESULTS.read_text().splitlines()
    other = lines[0].replace('"backend": "cpu"', '"backend": "gpu"')
    assert other != lines[0]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text(other + "\n")
    text = render(tmp_path, tmp_path / "out" / "parity.md", baseline_arm="peft-decoder")
    assert "come from 2 different environments" in text
    assert text.count("## Environment ") == 2
    # The gpu section holds only engine: the requested baseline is absent there.
    assert "`--baseline-arm peft-decoder` has no records in this environment" in text
    assert (tmp_path / "out" / "env2_speedup.png").exists()


def test_empty_and_corrupt_results_name_the_file_and_line(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ResultsError, match="no records"):
        render(tmp_path, tmp_path / "p.md")
    bad = tmp_path / "bad.jsonl"
    shutil.copy(RESULTS, bad)
    with bad.open("a") as f:
        f.write("{not json\n")
    n = len(RESULTS.read_text().splitlines()) + 1
    with pytest.raises(ResultsError, match=rf"bad.jsonl:{n}: not valid JSON"):
        render(bad, tmp_path / "p.md")


def test_unknown_baseline_arm_lists_present_arms(tmp_path):
    with pytest.raises(ValueError, match=r"^baseline arm 'nope' has no records here; arms "
                                         r"present: engine, native, peft-decoder, test-raise$"):
        render(RESULTS, tmp_path / "p.md", baseline_arm="nope")
    assert not (tmp_path / "p.md").exists()
