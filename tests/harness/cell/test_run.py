"""harness.cell.run: what a cell keeps whatever its gradient check does, and the fit check
that refuses a cell before anything of it is built.

The check is planted to fail (tests.harness.cell.failing_check) in a real cell process of
the real `native` arm: its own error (XLA's RESOURCE_EXHAUSTED, as on a TPU v5e where the
reference ran out of HBM beside the arm), a hang the parent kills at the cell's timeout, and
a process that dies inside it. Each time the record is `ok`, holds the timing, memory and
cost measured before the check, and says why parity was not checked.
"""

import dataclasses
import json

import jax
import pytest
from flax import nnx

from harness.grid.expand import expand
from harness.jobs.run import run_grid
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


def test_a_cell_that_does_not_fit_is_refused_before_it_is_built(tmp_path):
    """A limit below the plan refuses every arm's cell with its planned and available bytes;
    nothing is built (no build phase, no timing). A limit above it runs the cell with the
    plan beside the measurement: the plan's peak is the run's executables' planned peak to
    the byte (the same program, compiled twice), and the build loads what the check
    compiled from the run's compilation cache."""
    cells = expand({**TINY, "arms": ["native", "engine"], "ga": [2], "fit_bytes": 1024})
    _, refused = run_grid(cells, tmp_path / "small", env=cli_env(), timeout_s=300)
    for record in refused:
        assert record.error.reason == "does-not-fit", record.error
        assert record.error.message.startswith("does not fit: planned 0.00 of 0.00 GiB (")
        # with the gradient capture, then without: the seconds are both plans'
        assert " over 2 plans, " in record.error.message, record.error.message
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
        # the compile phase is every compile of the build (the initializer's too), not
        # only the step's
        assert record.phases["compile"] > record.timing.compile_s > 0


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


def test_a_cell_that_fits_only_without_the_captured_gradient_is_measured_without_it(
        tmp_path):
    """The gradient check adds a parameter-sized float32 buffer (the captured gradient):
    where the program fits without it and not with it, the cell is measured without it and
    its record says why its parity was not checked."""
    from arms.abstract import bytes_per_device
    from arms.registry import make_arm
    from arms.spec import CellSpec

    cells = expand({**TINY, "arms": ["native"], "fit_bytes": 2**30})
    _, (with_capture,) = run_grid(cells, tmp_path / "with", env=cli_env(), timeout_s=300)
    high = with_capture.plan.planned_peak_bytes
    assert with_capture.parity is not None and high == with_capture.memory.planned_bytes
    # the captured gradient: one float32 buffer of every parameter
    params = make_arm("native", CellSpec.from_dict(cells[0].spec)).build_abstract_model()
    captured = bytes_per_device([x for x in jax.tree.leaves(nnx.state(params, nnx.Param))])
    limit = high - captured // 2  # fits without the captured gradient, not with it
    between = [dataclasses.replace(c, fit_bytes=limit) for c in cells]
    _, (record,) = run_grid(between, tmp_path / "between", env=cli_env(), timeout_s=300)
    assert record.ok and record.timing.step_ms and record.parity is None
    without = record.plan.planned_peak_bytes
    assert without == record.memory.planned_bytes  # the plan is of the program it ran
    assert without < limit < high and high - without >= captured
    assert record.parity_not_checked.startswith("does not fit with the captured gradient: "
                                                "planned 0.00 of 0.00 GiB (step; checked in")
    assert "; measured without it, planned 0.00 of 0.00 GiB" in record.parity_not_checked
    # a cell whose parity is not asked for is planned, built and timed without the capture
    unasked = expand({**TINY, "arms": ["native"], "fit_bytes": limit, "parity": False})
    _, (plain,) = run_grid(unasked, tmp_path / "unasked", env=cli_env(), timeout_s=300)
    assert plain.ok and plain.parity is None and plain.parity_not_checked is None
    assert plain.plan.planned_peak_bytes == plain.memory.planned_bytes == without
