"""Several arms of one shape timed in one process, in alternating slices (A B C, B C A,
C A B, ...), so that what moves a whole process (its memory layout, the machine's state while
it runs) moves every arm of it alike; and the worker's end of lockstep's gate, through which
another process's slices alternate with this one's (`parity ab`).

Whole processes of identical code run 6-15% apart on a 2-core VM, against 1-3% inside one
process; interleaving arms inside one process pairs their slices, and the ratio of two arms
is read from those pairs (`reports.stats.compare_slices`). The parent repeats such a process
over a few rounds, so the luck of one process is sampled too.
"""

from __future__ import annotations

import importlib
import socket
from collections.abc import Sequence

from harness.cell.phases import Phases, start_backend
from harness.cell.sections import (
    block,
    build_arm,
    cost_section,
    gradient_check,
    memory_section,
    planned_memory,
    timing_record,
    warm_up,
)
from harness.contract import DONE, GO, READY, CellRun, slice_order
from harness.measure import timing as measure_timing
from reports.record import Record


class Gate:
    """The worker's end of lockstep's gate (harness.contract's messages): says it is ready,
    then waits to be told to time each slice."""

    def __init__(self, fd: int):
        self._sock = socket.socket(fileno=fd)

    def ready(self) -> None:
        self._sock.sendall(READY)

    def wait(self) -> None:
        if self._sock.recv(1) != GO:
            raise RuntimeError("the lockstep parent closed the gate before the last slice "
                               "(it stopped, or gave up on this process at its timeout)")

    def done(self) -> None:
        self._sock.sendall(DONE)

    def released(self) -> None:
        """Waits after the last slice until the parent ends the pair (closes its end), so
        that what this process does next (cost analysis, writing its record, exiting) never
        runs beside the other process's last slice."""
        while self._sock.recv(1):
            pass


def run_paired(runs: Sequence[CellRun], slices: int, phases: Phases,
               gate: Gate | None = None) -> list[Record]:
    """Builds every arm of `runs` (one shape) here, warms each, then times `slices` slices
    of steps/slices steps each, the arm order rotated from slice to slice (`slice_order`);
    one record per arm, its parity checked once every arm is closed (`_check_parity`). With
    a `gate` (lockstep A/B, harness.orchestrator.lockstep), the process says when it is
    ready and times each slice only when told to, as another process's slices alternate
    with its own."""
    from arms.registry import lookup
    from arms.spec import CellSpec

    for module in dict.fromkeys(m for run in runs for m in run.plugins):
        importlib.import_module(module)
    spec = CellSpec.from_dict(runs[0].spec)
    choices = [lookup(run.arm) for run in runs]
    for choice in choices:
        choice.preload()
    phases.end("imports")
    compiles = start_backend(phases)
    built = []
    for run, choice in zip(runs, choices, strict=True):
        arm, build_s = build_arm(choice.make(spec))
        batches = arm.place(spec.micro_batches(0))
        warm_up(arm, batches, run)
        built.append((run, arm, batches, build_s))
    phases.end("build")
    per_slice = runs[0].steps // slices
    samples = [([], [], []) for _ in built]
    pauses = [measure_timing.GCPauses() for _ in built]
    recompiles = [0] * len(built)
    measure_timing.settle_heap()
    if gate is not None:
        gate.ready()
    noise = _time_slices(built, slices, per_slice, samples, pauses, recompiles, compiles,
                         gate)
    if gate is not None:
        gate.released()
    phases.end("timed")
    records = []
    for k, (run, arm, _, build_s) in enumerate(built):
        timing = timing_record(arm, run, spec, samples[k], pauses[k], recompiles[k],
                               compiles, build_s, noise, slices=[per_slice] * slices)
        executables = arm.executables()
        planned = planned_memory(executables, arm.held_bytes())
        records.append(Record(
            about=arm.about(), timing=timing,
            memory=memory_section(planned, arm.calls_per_step(), None, 0),
            cost=cost_section(executables, arm.calls_per_step(), timing.stats.median_ms, spec)))
    phases.end("cost")
    for _, arm, *_ in built:
        arm.close()
    del built
    _check_parity(records, runs, choices, spec)
    phases.end("reference")
    return records


def _check_parity(records: list[Record], runs: Sequence[CellRun], choices, spec) -> None:
    """Each checked arm's gradient parity, once every measured arm is closed
    (harness.cell.sections.gradient_check); a check that fails says why in its record, the
    measurements stand."""
    for record, run, choice in zip(records, runs, choices, strict=True):
        if run.parity:
            record.parity, record.parity_not_checked = gradient_check(choice, spec)


def _time_slices(built, slices: int, per_slice: int, samples, pauses, recompiles,
                 compiles, gate: Gate | None) -> dict:
    """The timed slices, each an arm's steps/slices steps, in `slice_order`, and with a
    `gate`, each slice begun when it says. Returns the machine's readings over the slices
    (`measure_timing.NoiseMeter`), its probes taken in this process's own turns: the first after
    the first go, the last before the gate hears of the last slice."""
    meter = None
    for index in range(slices):
        if gate is not None:
            gate.wait()
        meter = meter or measure_timing.NoiseMeter()
        with meter.window():
            for k in slice_order(len(built), index):
                _, arm, batches, *_ = built[k]
                before = compiles.count
                with pauses[k].watch():
                    wall, dispatch, wait = measure_timing.timed_steps(
                        lambda a=arm, b=batches: a.step(b), per_slice, block)
                recompiles[k] += compiles.count - before
                for kept, new in zip(samples[k], (wall, dispatch, wait), strict=True):
                    kept += new
        noise = meter.close() if index == slices - 1 else None
        if gate is not None:
            gate.done()
    return noise
