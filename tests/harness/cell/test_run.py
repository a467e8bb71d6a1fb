"""harness.cell.run: what a cell keeps whatever its gradient check does, and the fit check
that refuses a cell before anything of it is built.

The check is planted to fail (tests.harness.cell.failing_check) in a real cell process of
the real `native` arm: its own error (XLA's RESOURCE_EXHAUSTED, as on a TPU v5e where the
reference ran out of HBM beside the arm), a hang the parent kills at the cell's timeout, and
a process that dies inside it. Each time the record is `ok`, holds the timing, memory and
cost measured before the check, and says why parity was not checked.
"""

import collections
import dataclasses
import json

import pytest

from harness.grid.expand import expand
from harness.jobs.run import run_grid
from reports.parity import GRAD_TOLERANCE
from reports.record import Record
from tests.harness.cli_helpers import cli_env, parity_cli
from tests.harness.orchestrator.test_loop import TINY

CHECK_PLUGIN = "tests.harness.cell.failing_check"


def _run(tmp_path, fault: str, timeout_s: float = 300, **options) -> Record:
    cells = expand({**TINY, "arms": ["native"], "steps": 3, **options})
    cells = [dataclasses.replace(c, plugins=(CHECK_PLUGIN,)) for c in cells]
    _, (record,) = run_grid(cells, tmp_path, env=cli_env(PARITY_TEST_CHECK=fault),
                            timeout_s=timeout_s)
    return record


def _measured(record: Record) -> None:
    """Everything measured before the check is in the record."""
    assert record.ok, record.error
    assert len(record.timing.step_ms) == 3 and record.timing.stats.median_ms > 0
    assert record.memory.planned_bytes > 0
    assert record.cost.compiled_flops_per_step > 0
    assert record.parity is None


@pytest.mark.parametrize("fault, reason, said", [
    ("oom", "oom: ", "RESOURCE_EXHAUSTED"),
    ("exit", "crash: ", "cell process exited with code 1"),
])
def test_a_check_that_fails_keeps_every_measurement_and_says_why(tmp_path, fault, reason,
                                                                 said):
    record = _run(tmp_path, fault)
    _measured(record)
    assert record.parity_not_checked.startswith(reason), record.parity_not_checked
    assert said in record.parity_not_checked
    assert "without a record" not in record.parity_not_checked  # it kept one


@pytest.mark.slow  # waits out the cell's 40 s timeout
def test_a_check_killed_at_the_cells_timeout_keeps_the_measurement(tmp_path):
    record = _run(tmp_path, "hang", timeout_s=40)
    _measured(record)
    why = record.parity_not_checked
    assert why.startswith("timeout: cell exceeded its 40 s timeout"), why
    assert "cost " in why and "without ending" in why  # where it was: after the cost phase


def test_the_report_and_the_console_say_why_parity_was_not_checked(tmp_path):
    record = _run(tmp_path, "oom")
    (path,) = tmp_path.glob("*.jsonl")
    done = parity_cli("report", str(tmp_path), "-o", str(tmp_path / "parity.md"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "parity.md").read_text()
    assert "| native | not checked (oom: JaxRuntimeError: RESOURCE_EXHAUSTED" in text
    assert json.loads(path.read_text())["parity_not_checked"] == record.parity_not_checked


@pytest.mark.slow  # a cell process per arm (~35 s); test_a_cold_cell_compiles_each_program_once
# runs the fit check in make test
def test_a_cell_that_does_not_fit_is_refused_before_it_is_built(tmp_path):
    """A limit below the plan refuses every arm's cell with its planned and available bytes;
    nothing is built (no build phase, no timing). A limit above it runs the cell with the
    plan beside the measurement: the plan's peak is the run's executables' planned peak to
    the byte (the same program), and the build loads what the check compiled from the
    run's compilation cache."""
    cells = expand({**TINY, "arms": ["native", "engine"], "ga": [2], "fit_bytes": 1024})
    _, refused = run_grid(cells, tmp_path / "small", env=cli_env(), timeout_s=300)
    for record in refused:
        assert record.error.reason == "does-not-fit", record.error
        assert record.error.message.startswith("does not fit: planned 0.00 of 0.00 GiB (")
        assert record.plan.planned_peak_bytes > 1024 == record.plan.hbm_capacity_bytes
        assert record.plan.fits is False and record.timing is None
        assert "fit" in record.phases and "build" not in record.phases
    fits = [dataclasses.replace(c, fit_bytes=2**30) for c in cells]
    _, ran = run_grid(fits, tmp_path / "large", env=cli_env(), timeout_s=300)
    for record in ran:
        assert record.ok, record.error
        assert record.plan.planned_peak_bytes == record.memory.planned_bytes
        # the executables the cell ran, read by the plan's HLO reader: the plan's costs
        counted = record.cost.categories_per_step.values()
        assert sum(c["flops"] for c in counted) == record.plan.flops_per_step > 0
        assert sum(c["hbm_bytes"] for c in counted) == record.plan.hbm_bytes_per_step > 0
        assert record.plan.fits is True and not record.is_plan
        assert record.timing.compile_cache_hits >= len(record.plan.executables)
    # the compile phase is every compile of the build (the initializer's too), not only the
    # step's: the run's first cell compiles our decoder's initializer, which the next arm
    # loads from the cache the run's cells share
    first, second = ran
    assert first.phases["compile"] > first.timing.compile_s > 0
    initializer = [e for e in first.timing.compile_log
                   if e["phase"] == "build" and not e["cached"]]
    assert initializer and all(e["program"] in {x["program"] for x in
                                                second.timing.compile_log if x["cached"]}
                               for e in initializer)


def test_peftrainer_s_fit_check_plans_the_program_its_build_compiles(tmp_path):
    """PeftTrainer's plan is built from shapes (its optimizer traced abstractly) and its
    build from arrays; the two lower the same program, to each scalar's placement (the
    optimizer's step count is replicated on the mesh in both), so the build loads the fit
    check's compile from the run's cache and the costs of what ran are the plan's."""
    cells = expand({**TINY, "arms": ["peft-decoder"], "ga": [1], "fit_bytes": 2**30})
    _, (record,) = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    assert record.ok, record.error
    assert record.timing.compile_cache_hits >= len(record.plan.executables) == 1
    counted = record.cost.categories_per_step.values()
    assert sum(c["hbm_bytes"] for c in counted) == record.plan.hbm_bytes_per_step > 0


@pytest.mark.slow  # checked and unchecked cell processes of two arms (~30 s)
def test_a_checked_cell_times_the_trainer_s_own_program(tmp_path):
    """The parity check adds nothing to the program a cell times (the gradient is read back
    from the optimizer's state after the first step): a checked cell's plan is an
    unchecked cell's to the byte, so it fits a device that holds exactly the trainer's
    program, and its gradient still passes."""
    unasked = expand({**TINY, "arms": ["native", "engine"], "fit_bytes": 2**30,
                      "parity": False})
    _, plain = run_grid(unasked, tmp_path / "unchecked", env=cli_env(), timeout_s=300)
    for record in plain:
        assert record.ok and record.parity is None and record.parity_not_checked is None
    exact = [dataclasses.replace(c, parity=True, fit_bytes=r.plan.planned_peak_bytes)
             for c, r in zip(unasked, plain, strict=True)]
    _, checked = run_grid(exact, tmp_path / "checked", env=cli_env(), timeout_s=300)
    for mine, theirs in zip(checked, plain, strict=True):
        assert mine.ok, mine.error  # fits a device of exactly the trainer's planned peak
        assert mine.parity.rel_l2 <= GRAD_TOLERANCE, mine.parity.rel_l2
        assert mine.plan.planned_peak_bytes == theirs.plan.planned_peak_bytes
        assert mine.memory.planned_bytes == theirs.memory.planned_bytes
        assert mine.memory.executables == theirs.memory.executables
        assert mine.plan.hbm_bytes_per_step == theirs.plan.hbm_bytes_per_step


def test_a_cold_cell_compiles_each_program_once(tmp_path):
    """The fit check compiles the step for the device; the build loads those programs
    from the run's compilation cache instead of compiling them again, and the record's
    compile log says so program by program, each entry in its phase."""
    cells = expand({**TINY, "arms": ["engine"], "ga": [2], "fit_bytes": 2**30})
    _, (record,) = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    assert record.ok, record.error
    log = record.timing.compile_log
    steps = {f"jit({name})" for name in record.plan.executables}
    assert len(steps) == 3  # fwd_bwd, fwd_bwd_accumulate, update
    cold = collections.Counter(e["program"] for e in log if not e["cached"])
    assert all(cold[program] == 1 for program in steps), cold  # each compiled once...
    assert {e["phase"] for e in log if e["program"] in steps and not e["cached"]} == {"fit"}
    loaded = [e["cached"] for e in log if e["phase"] == "build" and e["program"] in steps]
    assert loaded == [True] * 3  # ... and loaded by the build
    # the check's too: its parity step loads the measured arm's programs
    assert {e["phase"] for e in log} == {"fit", "build", "parity step", "reference"}
    again = [e for e in log if e["phase"] == "parity step" and e["program"] in steps]
    assert len(again) == 3 and all(e["cached"] for e in again), again
    timed = [e for e in log if e["phase"] in ("fit", "build")]  # what Timing counted
    assert len(timed) == record.timing.compiles
    assert sum(e["cached"] for e in timed) == record.timing.compile_cache_hits


def test_a_cell_whose_build_compiles_its_step_again_says_so():
    """The console's line of a cell whose build compiled cold what its fit check had
    compiled (the compilation cache off, as on the TPU v5e host once): the chip's own
    record (docs/results/tpu-v5e), then the same log with the build's loaded."""
    from pathlib import Path

    from harness.cli.console import compiled_twice

    chip = (Path(__file__).resolve().parents[3] / "docs/results/tpu-v5e"
            / "chip-67-s1024-ga1-checked.jsonl")
    (native,) = [r for r in map(json.loads, chip.read_text().splitlines())
                 if r["arm"] == "native"]
    log = native["timing"]["compile_log"]
    assert compiled_twice(log) == ["jit(step)"]
    loaded = [dict(e, cached=e["phase"] == "build" or e["cached"]) for e in log]
    assert compiled_twice(loaded) == []
