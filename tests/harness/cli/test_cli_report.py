"""`parity report`: works with no flags after `parity run --arms engine,native`, the baseline
flag overrides, an absent baseline is one clear line and exit 2, --embed-images embeds."""

import pytest

from harness.cli import main
from tests.harness.cli_helpers import parity_cli
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


@pytest.mark.parametrize("fresh", [True, False], ids=["new-dir", "over-old-report"])
def test_a_report_stopped_midway_leaves_the_old_report_or_nothing(tmp_path, monkeypatch,
                                                                  capsys, fresh):
    """Ctrl-C after the first plot was drawn: no new plot beside an old document, no empty
    -o directory, no staging directory left; the old report, where there was one, intact."""
    from reports import plots

    results = write(fixture_records(("engine", "native")), tmp_path / "results" / "run.jsonl")
    out = tmp_path / "docs" / "parity.md"
    if not fresh:
        assert main(["report", str(results.parent), "-o", str(out)]) == 0
        before = {p.name: p.read_bytes() for p in out.parent.iterdir()}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plots, "sweep", interrupted)  # drawn after the speedup chart
    capsys.readouterr()
    assert main(["report", str(results.parent), "-o", str(out)]) == 130
    assert "interrupted (SIGINT)" in capsys.readouterr().err
    if fresh:
        assert not out.parent.exists()
    else:
        assert {p.name: p.read_bytes() for p in out.parent.iterdir()} == before
    assert not list(tmp_path.rglob(".parity-report-*"))


# A child that sends itself SIGINT the moment it starts importing $SIGINT_ON_IMPORT: the
# signal lands at a chosen point of `parity run`'s start, every time, rather than wherever a
# sleep ends.
_SIGINT_ON_IMPORT = """
import importlib.abc, os, signal, sys

# Ctrl-C in a terminal raises KeyboardInterrupt even where this test's runner ignores SIGINT
# (a background job inherits SIG_IGN, which Python would keep).
signal.signal(signal.SIGINT, signal.default_int_handler)

class SigintOn(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == os.environ["SIGINT_ON_IMPORT"]:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOn())
from harness.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("module", ["jax", "optax", "arms.registry", "harness.orchestrator.loop"])
def test_a_ctrl_c_while_the_command_imports_is_one_line(tmp_path, module):
    """SIGINT while `parity run` imports (JAX for the grid's parser, the arms' modules, the
    runner): exit 130 with one line, no traceback and no record."""
    out = tmp_path / "out"
    proc = parity_cli("run", "--arms", "native", "--preset", "tiny", "--out", str(out),
                      prelude=_SIGINT_ON_IMPORT, timeout=120, SIGINT_ON_IMPORT=module,
                      JAX_PLATFORMS="cpu")
    assert (proc.returncode, proc.stderr) == (130, "\nparity: interrupted (SIGINT)\n")
    assert not list(out.rglob("*.jsonl"))


@pytest.mark.parametrize(("change", "field"), [
    (lambda r: r.update(status="weird"), "field 'status': 'weird' is neither"),
    (lambda r: r.update(timing=None), "field 'timing': an ok record holds its timing"),
    (lambda r: r["timing"].update(step_ms=[]), "field 'timing.step_ms': an ok record has"),
    (lambda r: r["timing"].update(step_ms=[1.0, float("nan")]),
     "field 'timing.step_ms[1]': nan is not a finite time"),
])
def test_an_impossible_record_is_one_line_naming_file_line_and_field(tmp_path, capsys, change,
                                                                     field):
    """Records that pass the schema but that no writer produces: report and compare each say
    where and what in one line and exit 2, and report writes nothing."""
    import json

    good = [r.to_json() for r in fixture_records(("engine", "native"))]
    change(good[1])
    path = tmp_path / "results" / "r.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps(r) + "\n" for r in good))
    for argv in (["report", str(path.parent), "-o", str(tmp_path / "out" / "p.md")],
                 ["compare", str(path), str(path), "--fail-on-regression"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"parity: error: {path}:2: {field}") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a PeftTrainer cell end to end through the CLI (~30 s)
def test_a_ragged_peft_run_is_a_parity_fail_everywhere_and_strict_parity_exits_1(tmp_path):
    """PeftTrainer at GA=4 on ragged micro-batches averages micro-batch means: the cell runs
    (status ok) but fails gradient parity in its start/end lines, the run's closing line and
    the report's summary; with --strict-parity the run exits 1 for it."""
    from reports.record import read_dir

    out = tmp_path / "results"
    proc = parity_cli("run", "--arms", "peft-decoder", "--preset", "tiny", "--seq", "16",
                      "--batch", "8", "--ga", "4", "--ragged", "30,4,20,2", "--steps", "2",
                      "--warmup", "1", "--strict-parity", "--out", str(out),
                      JAX_PLATFORMS="cpu")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (record,) = read_dir(out)
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


def test_a_ctrl_c_inside_an_extensions_init_is_an_interrupt(monkeypatch, capsys):
    """jaxlib's C extension turns a KeyboardInterrupt in its init into an ImportError raised
    from it: that is a Ctrl-C (exit 130, one line); any other ImportError is raised."""
    from harness import cli

    def interrupted(argv):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as stop:
            raise ImportError("Encountered an error while initializing the extension.") from stop

    monkeypatch.setattr(cli, "_main", interrupted)
    assert cli.main(["run"]) == 130
    assert capsys.readouterr().err == "\nparity: interrupted (SIGINT)\n"

    def broken(argv):
        raise ImportError("no module named x")

    monkeypatch.setattr(cli, "_main", broken)
    with pytest.raises(ImportError, match="no module named x"):
        cli.main(["run"])
