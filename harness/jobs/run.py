"""`parity run`: a grid's cells, each in processes of its own (or a shape's arms paired in
one process), their records appended to the run's results file as they end."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.contract import IN_PROCESS, PROCESSES, CellRun
from harness.grid import options as grid_options
from harness.jobs.deadline import Deadline
from harness.jobs.grid import Grid, OnRecord, OnStart, Request, Watch, quiet, traced
from harness.orchestrator.executors import CellProcesses, NotRun, PairedProcesses, groups
from harness.orchestrator.loop import Sink, Slot, run_tasks, schedule
from harness.store.layout import OutDir, RunStore, new_run_id
from reports.record import Record


def run_grid(cells: Sequence[CellRun], out: str | Path, *, env: dict[str, str],
             timeout_s: float, rounds: int = 1, run_id: str | None = None,
             suite: str | None = None, environment: dict | None = None,
             distributed: dict | None = None, alongside: Callable[[], None] | None = None,
             jobs: int = 1, prefork: bool = True, on_start: OnStart | None = None,
             on_record: OnRecord | None = None,
             unrun: Sequence[tuple[CellRun, str]] = (),
             deadline: Deadline | None = None) -> tuple[Path, list[Record]]:
    """(results path, new records): every cell `rounds` times, interleaved
    (harness.orchestrator.loop.schedule), each in a process of its own, forked from its
    arm's zygote where `prefork`; records appended to OUT/<run id>[-<suite>].jsonl as they
    end, a resumed run (an existing `run_id`) skipping the cells recorded under it.
    `environment` stands in for workers that died before writing their own. With
    `distributed` this is one process of a multi-process run (only process 0 writes);
    `alongside` runs while the zygotes import (`--selftest`); `jobs` > 1 plans that many
    cells side by side (plans only: a timed cell's figures would measure the other cells
    too). The `unrun` cells (an arm this environment cannot run, and why) are recorded first,
    once each, as not run (no process). A `deadline` (harness.jobs.deadline) may decline
    the cells it expects to end past its limit: they are not run and leave no record."""
    if jobs > 1 and not all(c.plan_target for c in cells):
        raise ValueError(f"--jobs {jobs}: only plans run side by side; a timed cell runs "
                         "alone (its figures would measure the other cells too)")
    run_id = run_id or new_run_id()
    executor = CellProcesses(timeout_s=timeout_s, prefork=prefork, distributed=distributed,
                             alongside=alongside)
    with RunStore.temporary() as store:
        sink = Sink(path=OutDir(out).results(run_id, suite), run_id=run_id, store=store,
                    env=env, suite=suite, environment=environment,
                    writer=distributed is None or distributed.get("process_id", 0) == 0)
        records = _record_unrun(unrun, sink, on_record)
        tasks = [(Slot(traced(cell, run_id, round_index), round_index, index, sink),)
                 for round_index, index, cell in schedule(cells, rounds)]
        keep = None
        if deadline is not None:
            deadline.learn_dir(sink.path.parent, (environment or {}).get("backend"))
            keep, on_record = deadline.keep, deadline.learning(on_record)
        records += run_tasks(tasks, executor, jobs=jobs, on_start=on_start,
                             on_record=on_record, keep=keep)
    return sink.path, records


def _record_unrun(unrun: Sequence[tuple[CellRun, str]], sink: Sink,
                  on_record: OnRecord | None) -> list[Record]:
    """The records of cells not run here (NotRun), appended to `sink`'s file."""
    if not unrun:
        return []
    why = {cell.arm: reason for cell, reason in unrun}
    tasks = [(Slot(cell, 0, -1, sink),) for cell, _ in unrun]
    return run_tasks(tasks, NotRun(why), on_record=on_record)


def run_cells(grid: Grid, *, jobs: int = 1, env: dict[str, str] | None = None,
              **options) -> tuple[Path, list[Record]]:
    """`run_grid` of a checked grid's cells, into its results file."""
    return run_grid(grid.cells, grid.out.root, env=env or grid.env, timeout_s=grid.timeout_s,
                    rounds=grid.rounds, run_id=grid.run_id, suite=grid.options.get("name"),
                    environment=grid.environment, jobs=jobs, unrun=grid.unrun, **options)


def run_paired(grid: Grid, slices: int, *, on_start: OnStart | None = None,
               on_record: OnRecord | None = None) -> tuple[Path, list[Record]]:
    """(results path, new records): each shape's arms built in one process and timed in
    `slices` alternating slices, `rounds` processes per shape (shapes in reversed order on
    odd rounds; parity checked in round 0). A traced window is a run of its own: none is
    taken here."""
    shapes = groups([dataclasses.replace(c, trace=False) for c in grid.cells])
    grid_options.check_pairable([c.arm for c in shapes[0]], grid.options.get("steps", 10), slices)
    index_of = {(c.arm, repr(c.spec)): n for n, c in enumerate(grid.cells)}
    with RunStore.temporary() as store:
        sink = Sink(path=grid.path, run_id=grid.run_id, store=store, env=grid.env,
                    suite=grid.options.get("name"), environment=grid.environment)
        unrun = _record_unrun(grid.unrun, sink, on_record)
        tasks = []
        for round_index in range(grid.rounds):
            for group in shapes if round_index % 2 == 0 else shapes[::-1]:
                tasks.append(tuple(
                    Slot(dataclasses.replace(c, parity=c.parity and not round_index),
                         round_index, index_of[c.arm, repr(c.spec)], sink) for c in group))
        records = run_tasks(tasks, PairedProcesses(timeout_s=grid.timeout_s, slices=slices),
                            on_start=on_start, on_record=on_record)
    return grid.path, unrun + records


def run(request: Request, options: dict, *, processes: int = 1, run_id: str | None = None,
        distributed: dict | None = None, alongside: Callable[[], None] | None = None,
        pairing: str = PROCESSES, slices: int = 8, deadline: Deadline | None = None,
        watch: Watch = quiet) -> tuple[Path, list[Record]]:
    """`parity run`: the grid of `options` (checked by harness.jobs.grid.check) run with
    `pairing`, its progress shown through `watch`; (results path, new records)."""
    if pairing == IN_PROCESS and (distributed or alongside):
        raise ValueError("--pairing in-process runs on one host without --selftest; "
                         "drop --num-processes/--distributed-auto and --selftest")
    if deadline is not None and (pairing == IN_PROCESS or distributed):
        raise ValueError("--time-limit stops a run between the cells of one host's "
                         "processes: drop it, or --pairing in-process / the multi-process "
                         "options")
    grid = Grid(request, options, processes=processes, run_id=run_id)
    total = len(grid.cells) * grid.rounds + len(grid.unrun) - grid.recorded()
    with watch(grid, total) as (on_start, on_record):
        if pairing == IN_PROCESS:
            return run_paired(grid, slices, on_start=on_start, on_record=on_record)
        return run_cells(grid, distributed=distributed, alongside=alongside,
                         prefork=prefork_on(grid.environment), on_start=on_start,
                         on_record=on_record, deadline=deadline)


def prefork_on(environment: dict) -> bool:
    """Whether cells start as forks of their arm's zygote: on the CPU backend only. There
    the zygote saves each process its imports (a third of a small cell's process); on an
    accelerator a cell's compiles dwarf those seconds, and a fork of a process that has
    loaded the accelerator plugin's libraries is a risk those seconds do not repay."""
    return environment.get("backend") == "cpu"
