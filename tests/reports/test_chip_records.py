"""The report of the TPU v5e chip's committed records (docs/results/tpu-v5e/chip-*.jsonl):
cells with and without a gradient check, refused cells and arms not run there, in one
document."""

import shutil
from pathlib import Path

from reports.document import render

CHIP = Path(__file__).resolve().parents[2] / "docs" / "results" / "tpu-v5e"


def test_the_chip_records_render_with_checked_unchecked_and_refused_cells(tmp_path):
    for name in ("chip-s1024-ga1.jsonl", "chip-batch8.jsonl"):
        shutil.copy(CHIP / name, tmp_path / name)
    text = render(tmp_path, tmp_path / "parity.md")
    assert "Gradient parity: 3 PASS, 0 FAIL, 2 not checked." in text
    assert "engine: does-not-fit: does not fit: planned 16.69 of 15.75 GiB" in text
    # a shape whose cells were not checked has no data digest: shown as missing
    assert "| qwen3-0.6b s1024 b8 ga1 bfloat16 | engine-fused | - | - | - |" in text
    assert "**Not run here**" in text and "maxtext not installed" in text
