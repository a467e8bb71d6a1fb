"""Lockstep: two commits' processes of one cell alive side by side, timed one slice each in
turn (A B, B A, A B, ...); the parent's side (the worker's is harness.cell.paired.Gate).

Two commits cannot share one process, so `parity ab` times each in its own. Run one after
the other, a pair of processes sees the machine at two moments; in lockstep both are built
and warm before either times, and slice i of A runs next to slice i of B, so what drifts
over seconds (the host's load, its clock) reaches both sides of a slice pair alike. The
pairs are compared like in-process pairing (`reports.stats.compare_slices`). What lockstep
cannot remove is the luck of each process (its memory layout): the rounds sample that.

The gate is a socket pair per side, harness.contract's messages one byte each: the worker
sends READY once built and warm, then for each slice waits for GO, times its steps and sends
DONE; after its last slice it waits until the parent closes its end, which happens once
both sides are done. A worker that dies closes its end, and the parent drives the other side
on alone. Workers start, end and become records through harness.orchestrator.spawn, as
every other worker does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import time
from collections.abc import Hashable, Sequence
from pathlib import Path

from harness.contract import DONE, GO, LOCKSTEP, READY, cell_json, slice_order, worker_args
from harness.orchestrator import spawn
from harness.orchestrator.loop import Slot, Task
from reports.record import Record


@dataclasses.dataclass
class _Side:
    """One live worker of a lockstep pair, seen from the parent."""

    slot: Slot
    proc: object
    sock: socket.socket
    out: Path
    err: Path
    alive: bool = True

    def expect(self, message: bytes, deadline: float) -> None:
        """Waits for `message`; a worker that closed its end, sent something else or is
        not heard from by `deadline` is driven no further (its record says why)."""
        if not self.alive:
            return
        self.sock.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            self.alive = self.sock.recv(1) == message
        except (TimeoutError, OSError):
            self.alive = False

    def tell(self, message: bytes) -> None:
        if self.alive:
            try:
                self.sock.sendall(message)
            except OSError:
                self.alive = False


class LockstepPairs:
    """Each task is one cell from two commits (a slot per side, the first to time first):
    both processes start together; once both are warm, `slices` slices alternate between
    them (harness.contract.slice_order), then both write their records. A side that fails
    gets its failure record, and the other is timed alone. A pair may take twice
    `timeout_s`, a cell's time limit (two cells build side by side)."""

    def __init__(self, *, timeout_s: float, slices: int):
        self.timeout_s, self.slices = 2 * timeout_s, slices

    @contextlib.contextmanager
    def session(self, tasks: Sequence[Task]):
        yield

    def key(self, task: Task) -> Hashable:
        return tuple(slot.sink.run_id for slot in task)

    def pairing(self, task: Task) -> list[str] | None:
        return [LOCKSTEP]

    def run(self, number: int, task: Task) -> list[Record]:
        deadline = time.monotonic() + self.timeout_s
        with spawn.worker_dir("parity-lockstep-") as tmp, contextlib.ExitStack() as stack:
            oom = spawn.OomWatch()
            start = time.perf_counter()
            # Both started and registered on `stack` before a stop may land: one landing
            # between a worker's start and its registration would leave it running while
            # the temp dirs it writes into are removed.
            with spawn.stops_held():
                sides = [self._start(stack, slot, tmp / str(k)) for k, slot in enumerate(task)]
            for side in sides:
                side.expect(READY, deadline)
            for index in range(self.slices):
                for k in slice_order(len(sides), index):
                    sides[k].tell(GO)
                    sides[k].expect(DONE, deadline)
            for side in sides:
                side.sock.close()  # both done: each may go on to its record
            records = []
            for side in sides:
                code, max_rss = spawn.wait(side.proc, max(0.0, deadline - time.monotonic()))
                ended = spawn.Exit.of(code, max_rss, side.out, side.err, oom)
                where = f"lockstep cell {side.slot.cell.arm} ({side.slot.sink.run_id})"
                records += spawn.records_of(ended, side.out, self.timeout_s, 1, where,
                                            time.perf_counter() - start)
        return records

    def _start(self, stack: contextlib.ExitStack, slot: Slot, base: Path) -> _Side:
        """Starts `slot`'s worker with its end of a new gate; it stops with `stack`."""
        ours, theirs = socket.socketpair()
        stack.callback(ours.close)
        out, err = base.with_suffix(".json"), base.with_suffix(".txt")
        env = {**slot.sink.env, **slot.sink.store.cell_env()}
        with theirs:
            args = worker_args(f"[{cell_json(slot.cell)}]", str(out), slices=self.slices,
                               gate_fd=theirs.fileno())
            proc = stack.enter_context(spawn.started_worker(
                args, env, err, slot.sink.cwd, pass_fds=[theirs.fileno()],
                module=slot.sink.worker_module, python=slot.sink.python))
        return _Side(slot=slot, proc=proc, sock=ours, out=out, err=err)
