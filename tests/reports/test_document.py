"""Golden test: a checked-in results file -> the checked-in markdown; PNGs decode at size."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reports.document import render
from reports.plots import DPI, SIZE
from reports.records import ResultsError, read_dir, to_frame

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results.jsonl"
SNAPSHOT = FIXTURES / "parity.md"


def test_fixture_renders_exactly_the_snapshot(tmp_path):
    text = render(RESULTS, tmp_path / "parity.md", baseline_arm="peft-decoder")
    assert text == SNAPSHOT.read_text()
    for name in ("step_times.png", "sweep.png", "memory.png"):
        assert f"]({name})" in text  # relative links
        image = Image.open(tmp_path / name)
        image.load()
        assert image.size == (int(SIZE[0] * DPI), int(SIZE[1] * DPI))
        assert np.asarray(image).std() > 0  # not a blank canvas


def test_failed_cells_are_listed_not_dropped():
    df = to_frame(read_dir(RESULTS))
    failed = df[df["status"] != "ok"]
    assert len(failed) >= 1
    text = SNAPSHOT.read_text()
    for _, row in failed.iterrows():
        assert f"| {row['arm']} | {row['error_reason']} |" in text


def test_environments_that_differ_get_separate_sections(tmp_path):
    lines = RESULTS.read_text().splitlines()
    other = lines[0].replace('"backend": "cpu"', '"backend": "gpu"')
    assert other != lines[0]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text(other + "\n")
    text = render(tmp_path, tmp_path / "out" / "parity.md", baseline_arm="peft-decoder")
    assert "come from 2 different environments" in text
    assert text.count("## Environment ") == 2


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
    with pytest.raises(ValueError, match="baseline arm 'nope' has no records here; arms "
                                         "present: engine"):
        render(RESULTS, tmp_path / "p.md", baseline_arm="nope")
