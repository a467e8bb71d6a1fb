"""Runs one cell in this process and returns its record.

Order inside the cell: build + compile (timed apart) -> the first warmup step, whose captured
gradient is kept for the parity check -> the other warmup steps -> the executables' planned
memory, and on the CPU backend the host heap they will reuse faulted in
(harness.measure.memory.reserve_heap) -> the untraced timed window (after a full garbage
collection: per-step wall, dispatch and wait; GC pauses; RSS high-water) -> compiled cost of
the executables -> an optional traced window (never the timed one) -> the exact reference
gradient, computed last so its memory cannot pollute the measured peaks. Each phase is a
small function (harness.cell.sections, harness.cell.reference) returning its section of the
`reports.record.Record` the cell writes. A cell with a plan target is planned instead
(harness.cell.plan).
"""

from __future__ import annotations

import importlib
import traceback

from harness.cell import sections
from harness.cell.phases import Phases, start_backend
from harness.cell.reference import parity_section
from harness.contract import OOM_MARKERS, PEER_MARKERS, CellRun
from reports.record import Failure, Record


def run_cell(run: CellRun, phases: Phases | None = None) -> Record:
    """Measures one cell in this process: a script of phases, each filling its section and
    ending its entry in `phases`."""
    phases = phases or Phases()
    for module in run.plugins:
        importlib.import_module(module)
    if run.plan_target:
        from harness.cell.plan import plan_cell

        return plan_cell(run, phases)
    from arms.registry import preload
    from arms.spec import CellSpec

    if run.warmup < 1:
        raise ValueError("warmup must be >= 1 (the first warmup step is the parity step)")
    spec = CellSpec.from_dict(run.spec)
    preload(run.arm)
    phases.end("imports")
    compiles = start_backend(phases)
    arm, build_s = sections.build_arm(run.arm, spec)
    phases.end("build", less={"compile": arm.compile_seconds})
    batches = arm.place(spec.micro_batches(0))
    first_loss, captured = sections.warm_up(arm, batches, run)
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
    traced = parity = None
    if run.trace:
        traced = sections.traced_window(arm, batches, run)
        phases.end("trace")
    if run.parity:
        parity = parity_section(spec, captured, first_loss, arm.trainer_denominator())
        phases.end("reference")
    arm.close()
    return Record(about=arm.about(), timing=timing,
                  memory=sections.memory_section(planned, arm.calls_per_step(), rss_growth,
                                                 reserved), cost=cost,
                  trace=traced, parity=parity)


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
