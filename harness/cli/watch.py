"""What a person watching a grid command sees: a line as each cell starts and ends (on
stdout whatever it is: a log, a pipe, CI), a progress bar on stderr when that is a
terminal, and, when a signal stops the command, one line saying what was kept (`Stopped`)."""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from harness.system.reaper import Terminated, terminate_on_signals


class Stopped(Exception):  # noqa: N818 - a stop, not a fault
    """The command was stopped by a signal; `code` is the exit status (130 SIGINT, 143
    SIGTERM)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def stopped_keeps(kept: Callable[[], str]):
    """SIGINT, SIGTERM and SIGHUP end the block with one line saying what is `kept()`, then
    `Stopped`; the cell running is killed and its temp files removed on the way out."""
    try:
        with terminate_on_signals():
            yield
    except KeyboardInterrupt:
        print(f"\nparity: interrupted (SIGINT); {kept()}", file=sys.stderr)
        raise Stopped(128 + signal.SIGINT) from None
    except Terminated as stop:
        print(f"\nparity: stopped by {stop}; {kept()}", file=sys.stderr)
        raise Stopped(stop.exit_code) from None


def stoppable(write, unwritten: str):
    """`write()`'s result, with SIGINT/SIGTERM/SIGHUP raised inside it; a stop prints that
    nothing was written (`unwritten`: what was not) and ends the command with its code."""
    try:
        with terminate_on_signals():
            return write()
    except Terminated as stop:
        print(f"\nparity: stopped by {stop}; {unwritten}", file=sys.stderr)
        raise Stopped(stop.exit_code) from None


class Progress:
    """The command line's watch of grid runs (harness.jobs.grid.Watch): for each grid, a
    line naming its cells and where they run, a line per cell started and ended, and what a
    stop keeps: the records in the grid's results file, or in `kept_in` where a command
    writes several (ab); `also_kept` adds to that line (e.g. "worktrees removed")."""

    def __init__(self, kept_in: Path | None = None, also_kept: str = ""):
        self.finished = 0
        self.path = kept_in
        self.kept_in, self.also_kept = kept_in, also_kept

    def kept(self) -> str:
        """What a stopped command leaves: the finished cells' records, where they are."""
        if not self.finished:
            kept = "no cell had finished; no record was written"
        else:
            kept = f"the {self.finished} finished cells' records are kept in {self.path}"
        return f"{kept}; {self.also_kept}" if self.also_kept else kept

    @contextlib.contextmanager
    def __call__(self, grid, total: int):
        from tqdm import tqdm

        from harness.cli import console

        unrun = len(grid.unrun)
        print(f"parity: {len(grid.cells)} cells {grid.where}"
              + (f" ({unrun} more not run here: their arms cannot run in this environment)"
                 if unrun else "") + f", results -> {grid.out.root}", flush=True)
        done = grid.recorded()
        if done:
            print(f"parity: resuming run {grid.run_id}: {done} cells are recorded in "
                  f"{grid.path} and are skipped", flush=True)
        self.path = self.kept_in or grid.path
        bar = tqdm(total=total, unit="cell", file=sys.stderr, disable=not sys.stderr.isatty())
        started, finished = 0, []  # the records so far: a cell's work is judged against them
        ended = 0

        def on_start(cell, round_index):
            nonlocal started
            started += 1
            tqdm.write(console.start_line(cell.arm, cell.spec, round_index, started, total),
                       file=sys.stdout)
            sys.stdout.flush()

        def on_record(index, record):
            nonlocal ended
            ended += 1
            self.finished += 1
            bar.update(1)
            # Counted by ends: cells planned side by side end in another order than they start
            tqdm.write(f"[{ended}/{total}] {console.cell_line(record, finished)}",
                       file=sys.stdout)
            finished.append(record)
            sys.stdout.flush()

        try:
            with stopped_keeps(self.kept):
                yield on_start, on_record
        finally:
            bar.close()
