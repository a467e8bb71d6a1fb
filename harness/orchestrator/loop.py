"""The one run loop: tasks of cells run by an executor, each record stamped with how it ran
and appended to its results file as it ends.

A task is what one executor call runs: one cell in a process of its own, one shape's arms
paired in one process, or one cell of each of two commits in lockstep. Each of its slots
says which cell, in which round, for which results file (`Sink`: a run's, or one side's of
an A/B). The loop resumes (a slot its file already records under the run id is not run
again), calls `on_start` and `on_record` around every slot, and holds each file's lock
while it runs: whatever the executor, a record reaches its file the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import threading
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Protocol

from harness.contract import CellRun, cell_hash
from harness.orchestrator.pool import run_keyed
from harness.store import results
from harness.store.layout import RunStore
from harness.system import allocator
from harness.system.reaper import raise_if_signalled
from reports.record import ABTag, Environment, Record, RunOptions, Spec, cell_name, codec, section


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sink:
    """One results file and how the cells whose records go there run."""

    path: Path
    run_id: str
    store: RunStore
    """What its cells share while the run lasts (compile caches, references)."""
    env: dict[str, str]
    """The variables its cells start with."""
    suite: str | None = None
    environment: dict | None = None
    """Stands in for the environment of a worker that died before writing its own."""
    cwd: Path | None = None
    """Where its workers run (an A/B worktree); None: here."""
    ab: ABTag | None = None
    worker_module: str | None = None
    """The worker module of the commit its cells run (an older commit's); None: ours."""
    python: str | None = None
    """The Python interpreter its workers run in (one side of an A/B of software stacks);
    None: this process's."""
    writer: bool = True
    """Whether this process writes the file (of a multi-process run, process 0 only)."""


@dataclasses.dataclass(frozen=True)
class Slot:
    cell: CellRun
    round: int
    index: int
    """The cell's position in the grid (`on_record`'s first argument)."""
    sink: Sink


Task = tuple[Slot, ...]


class Executor(Protocol):
    """Runs tasks: one record per slot, in the slots' order, whatever happened."""

    def session(self, tasks: Sequence[Task]) -> contextlib.AbstractContextManager: ...
    """Held while the tasks run (e.g. the zygotes their cells fork from)."""

    def run(self, number: int, task: Task) -> list[Record]: ...
    """The records of the `number`-th task to run."""

    def key(self, task: Task) -> Hashable: ...
    """Tasks of one key never run at once (`jobs` > 1)."""

    def pairing(self, task: Task) -> list[str] | None: ...
    """What the task's cells shared their timing with (RunOptions.pairing)."""


def schedule(cells: Sequence[CellRun], rounds: int) -> list[tuple[int, int, CellRun]]:
    """(round, cell index, cell) in run order: every cell once per round, the order reversed
    on odd rounds (A B C, C B A, ...) so slow drift of the machine reaches every cell alike.
    Only round 0 traces and checks parity (deterministic work; later rounds only time)."""
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: give at least 1 round")
    order = []
    for round_index in range(rounds):
        indices = range(len(cells)) if round_index % 2 == 0 else reversed(range(len(cells)))
        for index in indices:
            cell = cells[index]
            if round_index:
                cell = dataclasses.replace(cell, trace=False, parity=False)
            order.append((round_index, index, cell))
    return order


def recorded(path: Path, run_id: str) -> set[tuple]:
    """The `slot_key` of every cell and round `path` already holds a record of under
    `run_id`: a run resumed with the same --run-id skips them."""
    if not path.exists():
        return set()
    return {(r.arm, r.config_hash, r.round) for r in codec.read(path) if r.run_id == run_id}


def slot_key(cell: CellRun, round_index: int) -> tuple:
    """(arm, cell hash, round): what names a cell's round in a results file (`recorded`)."""
    return cell.arm, cell_hash(cell.spec), round_index


def stamp(record: Record, slot: Slot, pairing: list[str] | None = None) -> None:
    """Fills in what the parent knows of a slot's record: ids, spec, options, time, the
    allocator its worker ran on, and the environment where the worker died before writing
    its own."""
    cell, sink = slot.cell, slot.sink
    record.run_id, record.suite, record.arm = sink.run_id, sink.suite, cell.arm
    record.round = slot.round
    record.spec = section(Spec, cell.spec)
    record.config_hash = cell_hash(cell.spec)
    record.run = RunOptions(steps=cell.steps, warmup=cell.warmup, trace=cell.trace,
                            trace_steps=cell.trace_steps, parity=cell.parity,
                            trace_hlo=cell.trace_hlo, plan_target=cell.plan_target,
                            plan_slices=cell.plan_slices, plan_libtpu=cell.plan_libtpu,
                            pairing=pairing)
    record.timestamp = datetime.datetime.now(datetime.UTC).isoformat()
    record.ab = sink.ab
    if record.environment is None and sink.environment is not None:
        record.environment = section(Environment, sink.environment)
    if record.environment is not None:
        # The parent chose the worker's allocator, so the parent records it (also for an
        # older commit's worker that does not).
        record.environment.host_malloc = allocator.describe(sink.env)


def run_tasks(tasks: Sequence[Task], executor: Executor, *, jobs: int = 1,
              on_start: Callable[[CellRun, int], None] | None = None,
              on_record: Callable[[int, Record], None] | None = None,
              keep: Callable[[Task], bool] | None = None) -> list[Record]:
    """Runs every task whose slots are not all recorded yet (`recorded`), appending each new
    record to its sink's file as its task ends; returns the new records in task order.
    `jobs` > 1 runs that many tasks side by side (harness.orchestrator.pool; plans only):
    files then hold records in the order the tasks ended. `keep(task)`, asked as each task
    is about to start (after the records of the tasks before it), may decline it: it does
    not run and leaves no record (the rounds of a cell a sequential A/B has settled:
    harness.jobs.stopping)."""
    sinks = list({id(slot.sink): slot.sink for task in tasks for slot in task}.values())
    done = {id(s): recorded(s.path, s.run_id) for s in sinks}
    pending = [task for task in tasks
               if not all(slot_key(slot.cell, slot.round) in done[id(slot.sink)] for slot in task)]
    finished: list[tuple[int, list[Record]]] = []
    one_at_a_time = threading.Lock()  # the files, the callbacks, the executor's tables

    def run(number: int, task: Task) -> None:
        raise_if_signalled()
        with one_at_a_time:
            if keep is not None and not keep(task):
                finished.append((number, []))
                return
            for slot in task:
                if on_start:
                    on_start(slot.cell, slot.round)
        found = executor.run(number, task)
        pairing = executor.pairing(task)
        with one_at_a_time:
            new = []
            for slot, record in zip(task, found, strict=True):
                if slot_key(slot.cell, slot.round) in done[id(slot.sink)]:
                    continue  # recorded before a stop: kept, not recorded twice
                stamp(record, slot, pairing)
                kept = sum(len(r) for _, r in finished) + len(new)
                _append(slot, record, kept, len(pending) - len(finished) - 1)
                new.append(record)
                if on_record:
                    on_record(slot.index, record)
            finished.append((number, new))

    with contextlib.ExitStack() as stack:
        for sink in sinks:
            if sink.writer:
                stack.enter_context(results.exclusive(sink.path))
        stack.enter_context(executor.session(pending))
        if jobs > 1:
            run_keyed(pending, jobs, executor.key, run)
        else:
            for number, task in enumerate(pending):
                run(number, task)
    return [record for _, found in sorted(finished, key=lambda pair: pair[0])
            for record in found]


def _append(slot: Slot, record: Record, kept: int, left: int) -> None:
    """Appends `record` to its sink's file (where this process writes it); `kept` records
    were appended before it, `left` tasks are still to run."""
    if not slot.sink.writer:
        return
    try:
        results.append(slot.sink.path, record)
    except results.WriteError as err:
        lost = cell_name(slot.cell.arm, record.spec) + f" round {record.round}"
        raise results.WriteError(
            f"{err}. Lost: the record of {lost}; {kept} earlier records are kept, {left} cells "
            f"did not run. Free space, then run the same command with --run-id "
            f"{slot.sink.run_id}: it skips the cells recorded under that id and appends the "
            "rest") from err
