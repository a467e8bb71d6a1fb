"""How the run loop's tasks run: a cell in a process of its own (a fresh interpreter, or a
child forked from its arm's zygote), or the arms of one shape paired in one process. Both
start workers through harness.orchestrator.spawn and turn their ends into records there;
lockstep's pairs are harness.orchestrator.lockstep.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path

from harness.contract import SPAWNED_AT, CellRun, cell_json, worker_args
from harness.orchestrator import spawn
from harness.orchestrator.loop import Slot, Task
from harness.orchestrator.zygote import Zygote, ZygoteError, Zygotes, zygote_key
from harness.system.reaper import REAPER
from reports.record import UNAVAILABLE, Failure, Record


def _env(slot: Slot) -> dict[str, str]:
    return {**slot.sink.env, **slot.sink.store.cell_env()}


class CellProcesses:
    """Each task is one cell in a process of its own: forked from its arm's zygote (which
    imported the arm's packages once, harness.orchestrator.zygote) where `prefork`, else a
    fresh interpreter. With `distributed` ({"coordinator": "HOST:PORT", "num_processes",
    "process_id"}) each cell is one process of a multi-process cell, the k-th task's
    processes meeting at PORT + k. `alongside` runs once the zygotes have started
    importing, and the first cell only after it returned (`parity run --selftest`)."""

    def __init__(self, *, timeout_s: float, prefork: bool = True,
                 distributed: dict | None = None,
                 alongside: Callable[[], None] | None = None):
        self.timeout_s, self.prefork = timeout_s, prefork
        self.distributed, self.alongside = distributed, alongside
        self.zygotes: Zygotes | None = None

    @contextlib.contextmanager
    def session(self, tasks: Sequence[Task]):
        cells = [task[0].cell for task in tasks]
        sink = tasks[0][0].sink if tasks else None
        if not self.prefork or sink is None:
            if self.alongside is not None:
                self.alongside()
            yield
            return
        with Zygotes(sink.store, sink.env, sink.cwd, cells, self.alongside) as zygotes:
            self.zygotes = zygotes
            try:
                yield
            finally:
                self.zygotes = None

    def key(self, task: Task) -> Hashable:
        return zygote_key(task[0].cell)  # a zygote forks one worker at a time

    def pairing(self, task: Task) -> list[str] | None:
        return None

    def run(self, number: int, task: Task) -> list[Record]:
        (slot,) = task
        cell = slot.cell
        if self.distributed:
            cell = dataclasses.replace(cell, distributed=_cell_distributed(self.distributed,
                                                                           number))
        zygote = self.zygotes.get(cell) if self.zygotes is not None else None
        record = run_cell_process(cell, _env(slot), self.timeout_s,
                                  slot.sink.cwd, zygote, slot.sink.worker_module,
                                  slot.sink.python)
        if zygote is not None and zygote.forked == 1 and record.phases is not None:
            record.phases = {"preload": zygote.ready_s, **record.phases}
        return [record]


def run_cell_process(cell: CellRun, env: dict[str, str], timeout_s: float,
                     cwd: Path | None = None, zygote: Zygote | None = None,
                     module: str | None = None, python: str | None = None) -> Record:
    """Runs `cell` in a fresh process of interpreter `python` (None: this one), or a child
    forked from `zygote`; never raises for what happens inside the cell. The worker has its
    own process group (a timeout kills the cell and anything it started) and dies with this
    process (harness.system.reaper): SIGKILL of the parent included, no worker runs on and
    no temp dir stays behind."""
    with spawn.worker_dir("parity-cell-") as tmp:
        out, err_path = tmp / "record.json", tmp / "stderr.txt"
        start = time.perf_counter()
        oom = spawn.OomWatch()
        lost = None
        try:
            if zygote is not None and zygote.ready:
                code, max_rss = _forked(zygote, cell, env, out, err_path, timeout_s)
            else:
                args = worker_args(cell_json(cell), str(out))
                with spawn.started_worker(args, env, err_path, cwd, module=module,
                                          python=python) as proc:
                    code, max_rss = spawn.wait(proc, timeout_s)
        except ZygoteError as err:
            code, max_rss, lost = None, None, err
        ended = spawn.Exit.of(code, max_rss, out, err_path, oom)
        elapsed = time.perf_counter() - start
        if lost and not ended.wrote_record:
            record = spawn.failure("crash", f"the zygote forking {cell.arm}'s workers {lost}",
                                   ended.stderr)
            record.wall_s = elapsed
            return record
        return spawn.records_of(ended, out, timeout_s, 1, f"cell {cell.arm}", elapsed)[0]


def _forked(zygote: Zygote, cell: CellRun, env: dict[str, str], out: Path, err_path: Path,
            timeout_s: float) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS) of a worker forked from `zygote`; `env`
    adds to the zygote's only what differs from it."""
    extra = {k: v for k, v in env.items() if zygote.env.get(k) != v}
    pid = zygote.spawn(cell_json(cell), out, err_path,
                       {**extra, SPAWNED_AT: repr(time.time())})
    finished = False
    with REAPER.watch("group", pgid=pid):
        try:
            code, max_rss = zygote.wait(timeout_s)
            finished = code is not None
        finally:  # the timeout, SIGINT or SIGTERM: take the cell's group down
            spawn.kill_group(pid)
            if not finished:
                code, max_rss = zygote.reap(pid)
    return (code if finished else None), max_rss


def _cell_distributed(distributed: dict, index: int) -> dict:
    if distributed.get("auto"):
        return dict(distributed)
    host, port = distributed["coordinator"].rsplit(":", 1)
    return {**distributed, "coordinator": f"{host}:{int(port) + index}"}


class PairedProcesses:
    """Each task is one shape's arms built in one process and timed in `slices` alternating
    slices (harness.cell.paired); a process that fails fails every arm of it, with the same
    reason. Its arms share one compilation cache, their own."""

    def __init__(self, *, timeout_s: float, slices: int):
        self.timeout_s, self.slices = timeout_s, slices

    @contextlib.contextmanager
    def session(self, tasks: Sequence[Task]):
        yield

    def key(self, task: Task) -> Hashable:
        return tuple(slot.cell.arm for slot in task)

    def pairing(self, task: Task) -> list[str] | None:
        return [slot.cell.arm for slot in task]

    def run(self, number: int, task: Task) -> list[Record]:
        cells = [slot.cell for slot in task]
        timeout_s = self.timeout_s * len(cells)  # every arm of the process builds and times
        with spawn.worker_dir("parity-paired-") as tmp:
            out, err_path = tmp / "records.json", tmp / "stderr.txt"
            start = time.perf_counter()
            oom = spawn.OomWatch()
            args = worker_args(json.dumps([json.loads(cell_json(c)) for c in cells]),
                               str(out), slices=self.slices)
            with spawn.started_worker(args, _env(task[0]), err_path,
                                      task[0].sink.cwd) as proc:
                code, max_rss = spawn.wait(proc, timeout_s)
            ended = spawn.Exit.of(code, max_rss, out, err_path, oom)
            return spawn.records_of(ended, out, timeout_s, len(cells),
                                    f"paired cell {'+'.join(self.pairing(task))}",
                                    time.perf_counter() - start)


def groups(cells: Sequence[CellRun]) -> list[list[CellRun]]:
    """The cells grouped by shape (their spec), each group's arms in the order given."""
    found: dict[str, list[CellRun]] = {}
    for cell in cells:
        found.setdefault(json.dumps(cell.spec, sort_keys=True), []).append(cell)
    return list(found.values())


class NotRun:
    """Each task is a cell this environment cannot run (its arm's packages: `why`, by arm):
    its record, failed as unavailable, is made here; no process is started."""

    def __init__(self, why: dict[str, str]):
        self.why = why

    @contextlib.contextmanager
    def session(self, tasks: Sequence[Task]):
        yield

    def key(self, task: Task) -> Hashable:
        return task[0].cell.arm

    def pairing(self, task: Task) -> list[str] | None:
        return None

    def run(self, number: int, task: Task) -> list[Record]:
        return [Record(status="failed", error=Failure(
            reason=UNAVAILABLE, message=f"not run here: {self.why[slot.cell.arm]}"))
            for slot in task]
