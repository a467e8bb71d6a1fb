"""`parity report`: works with no flags after `parity run --arms engine,native`, the baseline
flag overrides, an absent baseline is one clear line and exit 2, --embed-images embeds."""

import pytest

from harness.cli import main
from tests.reports.helpers import RESULTS, fixture_records, write


def test_report_without_flags_after_engine_and_native_runs(tmp_path, capsys):
    results = write(fixture_records(("engine", "native")), tmp_path / "results" / "run.jsonl")
    out = tmp_path / "parity.md"
    assert main(["report", str(results.parent), "-o", str(out)]) == 0
    assert capsys.readouterr().out == f"report: {out}\n"
    text = out.read_text()
    assert "Baseline: **native**" in text and "](speedup.png)" in text
    assert (tmp_path / "speedup.png").exists()


def test_an_absent_baseline_arm_is_one_line_and_exit_2(tmp_path, capsys):
    results = write(fixture_records(("engine", "native")), tmp_path / "results" / "run.jsonl")
    code = main(["report", str(results.parent), "-o", str(tmp_path / "p.md"),
                 "--baseline-arm", "peft-decoder"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == ("parity: error: baseline arm 'peft-decoder' has no records here; arms "
                   "present: engine, native\n")


def test_baseline_override_and_embedded_images(tmp_path):
    out = tmp_path / "parity.md"
    assert main(["report", str(RESULTS), "-o", str(out), "--baseline-arm", "engine",
                 "--embed-images"]) == 0
    text = out.read_text()
    assert "Baseline: **engine** (chosen with `--baseline-arm`)" in text
    assert text.count("](data:image/png;base64,") == 4 and ".png)" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parity.md"]


@pytest.mark.slow  # a PeftTrainer cell end to end through the CLI (~30 s)
def test_a_ragged_peft_run_is_a_parity_fail_everywhere_and_strict_parity_exits_1(tmp_path):
    """PeftTrainer at GA=4 on ragged micro-batches averages micro-batch means: the cell runs
    (status ok) but fails gradient parity in its start/end lines, the run's closing line and
    the report's summary; with --strict-parity the run exits 1 for it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from harness import results

    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(repo), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--arms", "peft-decoder", "--preset",
         "tiny", "--seq", "16", "--batch", "8", "--ga", "4", "--ragged", "30,4,20,2",
         "--steps", "2", "--warmup", "1", "--strict-parity", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (record,) = results.read_dir(out)
    assert record.ok  # it ran: the exit status is the parity FAIL's
    lines = proc.stdout.splitlines()
    assert "[1/1] start peft-decoder tiny seq=16 batch=8 ga=4" in lines
    (end,) = [line for line in lines if line.startswith("[1/1] PARITY FAIL peft-decoder")]
    assert "mean of micro-batch means (optax.MultiSteps)" in end
    assert "its time is not comparable work" in end
    assert "parity: 1 cells failed gradient parity" in proc.stdout
    assert main(["report", str(out), "-o", str(tmp_path / "parity.md")]) == 0
    summary = (tmp_path / "parity.md").read_text().split("<details>")[0]
    assert "**FAIL**" in summary and "mean of micro-batch means" in summary
