"""Runs one cell in this process and returns its record.

The cell's arm is resolved and made once, then planned and built. Order inside the cell: on
an accelerator, the fit check (the step planned for the device from shapes alone, compiled
once: the build loads it; a cell that cannot fit is refused here, harness.cell.fit) -> build
+ compile (timed apart) -> the warmup steps -> the executables' planned memory, and on the
CPU backend the host heap they will reuse faulted in (harness.measure.memory.reserve_heap)
-> the untraced timed window (after a full garbage collection: per-step wall, dispatch and
wait; GC pauses; RSS high-water) -> compiled cost of the executables -> an optional traced
window (never the timed one) -> the devices' peak memory -> the arm closed and its device
buffers released -> where parity is checked, the parity step (a fresh arm of the same work
built and stepped once, the gradient its optimizer saw read back from the optimizer's own
state: nothing is added to the trainer's program, and nothing of the check is in the process
while it is timed) and the exact reference gradient, both after every measurement so that
neither can pollute it, and guarded so that nothing they do loses what was measured
(harness.cell.reference). Each phase is a small function (harness.cell.sections,
harness.cell.reference) returning its section of the `reports.record.Record` the cell
writes. A cell with a plan target is planned instead (harness.cell.plan).
"""

from __future__ import annotations

import importlib
import traceback
from collections.abc import Callable

from harness.cell import sections
from harness.cell.fit import check_fit
from harness.cell.phases import Phases, start_backend
from harness.contract import CHECK_PENDING, OOM_MARKERS, PEER_MARKERS, CellRun
from reports.record import Failure, Record


def run_cell(run: CellRun, phases: Phases | None = None,
             keep: Callable[[Record], None] | None = None) -> Record:
    """Measures one cell in this process: a script of phases, each filling its section and
    ending its entry in `phases`. `keep` is handed the measured record before the gradient
    check runs (its `parity_not_checked` CHECK_PENDING), so a check that ends the process
    leaves the measurements; the record returned is the same with the check's outcome."""
    phases = phases or Phases()
    for module in run.plugins:
        importlib.import_module(module)
    if run.plan_target:
        from harness.cell.plan import plan_cell

        return plan_cell(run, phases)
    from arms.registry import lookup
    from arms.spec import CellSpec

    if run.warmup < 1:
        raise ValueError("warmup must be >= 1 (a first step is never timed: it allocates "
                         "what the steps after it reuse)")
    spec = CellSpec.from_dict(run.spec)
    choice = lookup(run.arm)  # resolved once: the fit check and the build share one arm
    choice.preload()
    phases.end("imports")
    compiles = start_backend(phases)
    arm = choice.make(spec)
    fit = check_fit(run, choice, arm, spec, compiles)
    if fit is not None:
        phases.end("fit")
        if not fit.fits:
            return fit.failure()
    record = _measure(run, spec, arm, fit, compiles, phases)
    if run.parity:
        _check_parity(record, spec, choice, phases, keep)
    return record


def _measure(run: CellRun, spec, arm, fit, compiles, phases: Phases) -> Record:
    """Builds, warms, times (and traces) `arm`; returns its record, the arm closed."""
    compiled_before = compiles.seconds  # every compile of the build is the compile phase
    arm, build_s = sections.build_arm(arm)
    phases.end("build", less={"compile": compiles.seconds - compiled_before})
    readings = {"build": sections.device_reading()}
    batches = arm.place(spec.micro_batches(0))
    sections.warm_up(arm, batches, run)
    readings["warmup"] = sections.device_reading()
    phases.end("warmup")
    executables = arm.executables()
    planned = sections.planned_memory(executables, arm.held_bytes())
    reserved = sections.reserve_heap(planned)
    phases.end("memory")
    timing, rss_growth = sections.timed_window(arm, batches, run, spec, compiles, build_s)
    phases.end("timed")
    cost = sections.cost_section(executables, arm.calls_per_step(), timing.stats.median_ms,
                                 spec)
    phases.end("cost")
    traced = None
    if run.trace:
        traced = sections.traced_window(arm, batches, run)
        phases.end("trace")
    # The device peak is read before the check, whose memory is not the arm's.
    memory = sections.memory_section(planned, arm.calls_per_step(), rss_growth, reserved)
    memory.device_stats_after = readings
    timing.compile_log = compiles.log  # the same list: the check's compiles join it
    record = Record(about=arm.about(), timing=timing, memory=memory, cost=cost,
                    trace=traced, plan=fit and fit.plan)
    arm.close()
    return record


def _check_parity(record: Record, spec, choice, phases: Phases, keep) -> None:
    """The gradient check of a measured cell, once the arm's device buffers are released:
    `keep` (when given) is handed the record first, as it stands while the check runs; then
    the parity step and the reference (sections.gradient_check), each a phase of its own."""
    sections.release_device_memory()
    record.parity_not_checked = CHECK_PENDING
    if keep is not None:
        keep(record)
    record.parity, record.parity_not_checked = sections.gradient_check(choice, spec, phases)


def exception_failure(err: Exception, run: CellRun) -> Failure:
    """The failure a cell's exception stands for: `oom`, `peer-died` (a multi-process cell
    whose collectives lost a process) or `exception`."""
    message = f"{type(err).__name__}: {err}"
    reason = "exception"
    if any(marker in message for marker in OOM_MARKERS):
        reason = "oom"
    elif run.distributed and any(marker in message for marker in PEER_MARKERS):
        reason = "peer-died"
        message = ("another process of this multi-process cell died, or did not reach the "
                   f"collective within gloo's timeout; this one stopped instead of hanging. "
                   f"{message}")
    return Failure(reason=reason, message=message, traceback=traceback.format_exc()[-4000:])
