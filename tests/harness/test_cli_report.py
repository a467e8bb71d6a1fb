"""`parity report`: works with no flags after `parity run --arms engine,native`, the baseline
flag overrides, an absent baseline is one clear line and exit 2, --embed-images embeds."""

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
