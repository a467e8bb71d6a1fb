"""The cell worker's entry point (`python -m harness.cell`, or a child a zygote forked): its
arguments are harness.contract's; it writes the record of its cell, or with `--slices` the
records of one shape's arms timed in one process, to `--out`, whatever happens inside the
cell (a failure is a record too), and exits 0 when every record is ok."""

from __future__ import annotations

import functools
import json
import os

from harness.cell.phases import Phases, init_distributed
from harness.cell.run import exception_failure, run_cell
from harness.contract import PROTOCOL, SPAWNED_AT, cell_from_json, progress_file, worker_parser
from harness.store.results import write_whole
from reports.record import Environment, Record, section


def main(argv: list[str] | None = None) -> int:
    parser = worker_parser()
    args = parser.parse_args(argv)
    if args.protocol:
        print(PROTOCOL)
        return 0
    if args.cell is None or args.out is None:
        parser.error("--cell and --out are required")
    spawned = os.environ.get(SPAWNED_AT)
    phases = Phases(float(spawned) if spawned else None, progress=progress_file(args.out))
    cells = json.loads(args.cell)
    environment_once = functools.cache(_environment)

    def keep(record: Record) -> None:  # the measured record, before its gradient check
        record.environment, record.phases = environment_once(), dict(phases.seconds)
        _write(args.out, record.to_json())

    if args.slices:
        records = _paired(cells, args.slices, phases, args.gate_fd)
    else:
        records = [_single(cell_from_json(cells), phases, keep)]
    env = environment_once()
    phases.end("record")
    for record in records:
        record.environment, record.phases = env, phases.seconds
    data = [r.to_json() for r in records]
    _write(args.out, data if args.slices else data[0])
    return 0 if all(record.ok for record in records) else 1


def _write(path: str, data) -> None:
    """`data` as JSON at `path`, whole: the parent reads the last whole record written,
    whenever this process ends."""
    write_whole(path, json.dumps(data).encode())


def _single(run, phases: Phases, keep) -> Record:
    try:
        init_distributed(run)
        return run_cell(run, phases, keep)
    except Exception as err:  # recorded, not raised: the grid goes on
        return Record(status="failed", error=exception_failure(err, run))


def _paired(cells: list[dict], slices: int, phases: Phases, gate_fd: int) -> list[Record]:
    from harness.cell.paired import Gate, run_paired

    runs = [cell_from_json(cell) for cell in cells]
    try:
        return run_paired(runs, slices, phases, Gate(gate_fd) if gate_fd >= 0 else None)
    except Exception as err:  # recorded, not raised: every arm of the process failed
        return [Record(status="failed", error=exception_failure(err, run)) for run in runs]


def _environment() -> Environment:
    from harness.system.environment import environment

    return section(Environment, environment())
