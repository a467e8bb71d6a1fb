"""Lockstep A/B: the two refs' processes of one cell alive side by side, timed one slice
each in turn (A B, B A, A B, ...).

Two commits cannot share one process, so `parity ab` times each in its own. Run one after
the other, a pair of processes sees the machine at two moments; in lockstep both are built
and warm before either times, and slice i of A runs next to slice i of B, so what drifts
over seconds (the host's load, its clock) reaches both sides of a slice pair alike. The
pairs are compared like in-process pairing (`reports.stats.compare_slices`). What lockstep
cannot remove is the luck of each process (its memory layout): the rounds sample that.

Protocol over a socket pair (one byte a message): the worker sends READY once built and
warm, then for each slice waits for GO, times its steps and sends DONE; after its last slice
it waits until the parent closes its end, which happens once both sides are done. A worker
that dies closes its end, and the parent drives the other side on alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from harness.reaper import REAPER

READY, GO, DONE = b"r", b"g", b"d"
LOCKSTEP = "lockstep"
"""`parity ab --pairing` of this module (the other, "processes", runs A's and B's
processes one after the other)."""


class Gate:
    """The worker's end: says it is ready, then waits to be told to time each slice."""

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


@dataclasses.dataclass
class _Side:
    """One live worker of a lockstep pair, seen from the parent."""

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


def worker_args(cell_json: str, slices: int, out: Path, fd: int) -> list[str]:
    return ["--cell", f"[{cell_json}]", "--slices", str(slices), "--gate-fd", str(fd),
            "--out", str(out)]


def run_pair(cell, slices: int, sides: Mapping[str, tuple[dict[str, str], Path | None]],
             timeout_s: float) -> dict:
    """Record of `cell` from each side (name -> (env, cwd), the first to time first):
    both processes start together; once both are warm, `slices` slices alternate between
    them (`harness.paired.slice_order`), then both write their records. A side that fails
    gets its failure record, and the other is timed alone. The pair may take twice
    `timeout_s`, a cell's time limit."""
    from harness.paired import slice_order
    from harness.runner import STDERR_TAIL, Exit, _wait, cell_json, classify, started_worker
    from reports.record import Record

    timeout_s *= 2  # two cells build side by side
    deadline = time.monotonic() + timeout_s
    with tempfile.TemporaryDirectory(prefix="parity-lockstep-") as tmp, \
            REAPER.watch("path", path=tmp), contextlib.ExitStack() as stack:
        live: dict[str, _Side] = {}
        start = time.perf_counter()
        for name, (env, cwd) in sides.items():
            ours, theirs = socket.socketpair()
            stack.callback(ours.close)
            out, err = Path(tmp) / f"{name}.json", Path(tmp) / f"{name}.txt"
            with theirs:
                proc = stack.enter_context(started_worker(
                    worker_args(cell_json(cell), slices, out, theirs.fileno()), env, err,
                    cwd, pass_fds=[theirs.fileno()]))
            live[name] = _Side(proc=proc, sock=ours, out=out, err=err)
        for side in live.values():
            side.expect(READY, deadline)
        names = list(live)
        for index in range(slices):
            for k in slice_order(len(names), index):
                side = live[names[k]]
                side.tell(GO)
                side.expect(DONE, deadline)
        for side in live.values():
            side.sock.close()  # both done: each may go on to its record
        records = {}
        for name, side in live.items():
            code, max_rss = _wait(side.proc, max(0.0, deadline - time.monotonic()))
            stderr = side.err.read_text(errors="replace") if side.err.exists() else ""
            failure = classify(Exit(code=code, stderr=stderr, wrote_record=side.out.exists(),
                                    max_rss_bytes=max_rss), timeout_s)
            record = failure or Record.from_json(
                json.loads(side.out.read_text())[0], f"lockstep cell {cell.arm} ({name})",
                whole=False)
            if failure is None and record.error:
                record.error.stderr_tail = stderr[-STDERR_TAIL:]
            record.wall_s = time.perf_counter() - start
            records[name] = record
    return records
