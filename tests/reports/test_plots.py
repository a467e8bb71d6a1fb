"""Every figure is written as a PNG with a title, at 100+ dpi, and is not a blank canvas."""

import dataclasses

import numpy as np
import pytest
from PIL import Image

from reports import plots
from reports.frame import to_frame
from tests.reports.helpers import fixture_records


def _png(path):
    image = Image.open(path)
    image.load()
    return image


@pytest.mark.parametrize(("make", "title"), [
    (lambda df, p: plots.speedups(df, p, "peft-decoder"),
     "Speedup vs peft-decoder: median ms/step ratio with 95% CI"),
    (plots.step_time_distribution, "Step-time distribution"),
    (plots.sweep, "Median step time vs sequence length"),
    (plots.memory_bars, "Memory per arm and shape (MiB)"),
])
def test_each_figure_is_written_with_a_title(tmp_path, make, title):
    path = make(to_frame(fixture_records()), tmp_path / "figure.png")
    assert path == tmp_path / "figure.png"
    image = _png(path)
    assert image.info["Title"].startswith(title)
    assert min(image.info["dpi"]) >= 100 - 0.5 and plots.DPI >= 100
    assert image.size[0] >= 800
    assert np.asarray(image.convert("L")).std() > 0


def test_a_single_sequence_length_has_no_sweep(tmp_path):
    records = [r for r in fixture_records() if r.spec.seq == 16]
    assert plots.sweep(to_frame(records), tmp_path / "sweep.png") is None
    assert not (tmp_path / "sweep.png").exists()


def test_memory_adds_a_measured_panel_where_the_backend_reports_a_peak(tmp_path):
    cpu = _png(plots.memory_bars(to_frame(fixture_records()), tmp_path / "cpu.png"))
    measured = [dataclasses.replace(r, memory=dataclasses.replace(
        r.memory, peak_bytes_in_use=2**22)) if r.ok else r for r in fixture_records()]
    gpu = _png(plots.memory_bars(to_frame(measured), tmp_path / "gpu.png"))
    assert gpu.size[1] > 1.5 * cpu.size[1]  # a second panel below the planned one


def test_a_figure_without_a_title_is_refused(tmp_path):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    with pytest.raises(ValueError, match="needs a title"):
        plots.save(fig, tmp_path / "untitled.png")
