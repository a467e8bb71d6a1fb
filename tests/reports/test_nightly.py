"""The nightly's verdicts and report: each new cell judged against its comparable history
(reports.regression.against_history), then the markdown summary and the plot of a regressed
cell's history (reports.nightly)."""

import dataclasses

import numpy as np
from PIL import Image

from reports.nightly import history_plot, summary_markdown
from reports.record import Cost
from reports.regression import BASELINE_RUNS, FAILED, FIRST, OK, REGRESSION, against_history
from tests.reports.helpers import fixture_records, with_rounds

NATIVE = next(r for r in fixture_records(("native",)) if r.ok)
CELL = "native tiny seq=16 batch=4 ga=1"


def _night(day: int, median_ms: float, record=NATIVE, **changes):
    """Six rounds of `record`'s cell as night `day`'s run (its run id and timestamps order
    it), its steps scattered 1% around `median_ms`."""
    run_id = f"2026-01-{day:02d}"
    return [dataclasses.replace(r, run_id=run_id, timestamp=f"{run_id}T00:00:{r.round:02d}",
                                **changes)
            for r in with_rounds(record, median_ms, seed=day)]


def _history(nights: int, median_ms: float = 10.0, **changes):
    return [r for day in range(1, nights + 1) for r in _night(day, median_ms, **changes)]


def _costed(compiled_flops: float) -> Cost:
    return Cost(model_flops_per_step=1e9, model_flops_per_s=None, mfu_vs_bf16_peak=None,
                compiled_flops_per_step=compiled_flops, bytes_accessed_per_step=None,
                calls_per_step={"step": 1}, compiled_flops_per_executable={"step": None},
                bytes_accessed_per_executable={"step": None}, loop_trip_counts={})


def test_a_slowdown_regresses_and_a_night_like_the_history_is_ok():
    history = _history(2)
    (slow,) = against_history(_night(3, 20.0), history, threshold=0.05)
    assert slow.status == REGRESSION and slow.cell.name == CELL
    assert 1.9 < slow.comparison.timing.ratio < 2.1 and slow.comparison.timing.low > 1.0
    assert slow.history == history  # the baseline, oldest first
    (same,) = against_history(_night(3, 10.0), history, threshold=0.05)
    assert same.status == OK and same.comparison.cost_changes == []


def test_history_of_another_environment_or_of_the_same_run_is_never_compared():
    gpu = dataclasses.replace(NATIVE.environment, backend="gpu")
    (row,) = against_history(_night(3, 20.0), _history(2, environment=gpu), threshold=0.05)
    assert row.status == FIRST and row.comparison is None and row.history == []
    new = _night(1, 20.0)  # the nightly appends its run to the history before judging it
    (row,) = against_history(new, new, threshold=0.05)
    assert row.status == FIRST


def test_only_the_last_baseline_runs_are_compared_with():
    (row,) = against_history(_night(9, 10.0), _history(BASELINE_RUNS + 2), threshold=0.05)
    assert [r.run_id for r in row.history][::6] == [f"2026-01-{d:02d}" for d in range(3, 8)]
    assert len(row.comparison.old.ok) == 6 * BASELINE_RUNS


def test_a_cost_increase_regresses_whatever_the_timings_say():
    history = _history(2, cost=_costed(100.0))
    (same,) = against_history(_night(3, 10.0, cost=_costed(100.0)), history, threshold=0.05)
    assert same.status == OK and same.comparison.cost_changes == []
    (more,) = against_history(_night(3, 10.0, cost=_costed(101.0)), history, threshold=0.05)
    assert more.status == REGRESSION
    (change,) = more.comparison.cost_changes
    assert (change.metric, change.old, change.new) == ("compiled_flops_per_step", 100.0, 101.0)


def test_the_summary_has_a_row_per_cell_and_says_why():
    failed = next(r for r in fixture_records(("test-raise",)) if not r.ok)
    engine = next(r for r in fixture_records(("engine",)) if r.ok)
    new = [*_night(3, 20.0, cost=_costed(101.0)), *_night(3, 5.0, record=engine), failed]
    rows = against_history(new, _history(2, cost=_costed(100.0)), threshold=0.05)
    assert [row.status for row in rows] == [REGRESSION, FIRST, FAILED]
    text = summary_markdown(rows, 0.05)
    lines = text.splitlines()
    assert lines[0] == "# Nightly parity"
    assert ("slower than the comparable history (last 5 runs of the same arm, config and "
            "environment) beyond noise by at least 5%") in text
    # the rule names the minimum effect and process spread these runs were judged by
    assert ("Used for these runs: minimum effect 5%, the CPU machine's from its A/A floor; "
            "process spread log-SD 0.25 a process") in text
    (slow,) = [line for line in lines if line.startswith(f"| {CELL} |")]
    cells = [c.strip() for c in slow.split("|")[1:-1]]
    assert cells[1:3] == ["regression", "20.0"] and 9.8 < float(cells[3]) < 10.2
    assert cells[4] == "6 / 12" and cells[6] == "slower" and cells[8] == "compiled_flops_per_step"
    assert "| engine tiny seq=16 batch=4 ga=1 | first run (baseline) | 5.0 | - | - | - | - |" \
        in text
    assert "| test-raise tiny seq=16 batch=4 ga=1 | failed: exception | - | - |" in text
    notes = text.split("Cost changes, new baselines and warnings:")[1]
    assert f"- {CELL}: compiled_flops_per_step" in notes
    assert text.endswith("config) are not compared; they start a new baseline.\n")


def test_the_summary_of_cells_all_compared_has_no_baseline_note():
    rows = against_history(_night(3, 10.0), _history(2), threshold=0.1)
    text = summary_markdown(rows, 0.1)
    assert "beyond noise by at least 10%" in text and f"| {CELL} | ok |" in text
    assert "Used for these runs: minimum effect 10%; process spread" in text
    assert "new baseline" not in text and "Cost changes, new baselines and warnings" not in text


def test_the_history_plot_draws_every_run(tmp_path):
    (row,) = against_history(_night(3, 20.0), _history(2), threshold=0.05)
    path = history_plot(row, tmp_path / "regression_0.png")
    assert path == tmp_path / "regression_0.png"
    image = Image.open(path)
    assert image.size == (800, 400)
    assert np.asarray(image.convert("L")).std() > 0


def _plans(night_records, libtpu: str, peak_add: int):
    """The plan records of one synthetic night, planned by `libtpu`, each planned peak
    `peak_add` bytes above the night's."""
    return [dataclasses.replace(
        r, run=dataclasses.replace(r.run, plan_libtpu=libtpu),
        plan=dataclasses.replace(r.plan, libtpu=libtpu,
                                 planned_peak_bytes=r.plan.planned_peak_bytes + peak_add))
        for r in night_records if r.plan]


def test_a_plan_compiler_change_is_a_new_baseline_not_a_regression():
    """Plans made by two libtpus are two compilers' outputs: a grown planned peak across
    them is never called a regression; the note names the compiler change. The same growth
    under one compiler is a regression (the rule still bites)."""
    from tests.reports.site.synthetic import nightly_history

    records = nightly_history(nights=2, arms=("native",), presets=("qwen3-1.7b",), gas=(1,),
                              planted=[])
    first, second = sorted({r.run_id for r in records if r.plan})
    history = _plans([r for r in records if r.run_id == first], "0.0.48.1", 0)
    night = [r for r in records if r.run_id == second]
    (upgraded,) = against_history(_plans(night, "0.0.52", 2**30), history, threshold=0.05)
    assert upgraded.status == FIRST and upgraded.comparison is None
    assert upgraded.new_baseline == ["plan compiler libtpu 0.0.48.1 -> 0.0.52"]
    text = summary_markdown([upgraded], 0.05)
    assert ("not compared (a new baseline): plan compiler libtpu 0.0.48.1 -> 0.0.52"
            in text.split("Cost changes, new baselines and warnings:")[1])
    (same_compiler,) = against_history(_plans(night, "0.0.48.1", 2**30), history,
                                       threshold=0.05)
    assert same_compiler.status == REGRESSION
    assert [c.metric for c in same_compiler.comparison.cost_changes] == ["plan_peak_bytes"]
