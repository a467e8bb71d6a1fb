"""The parent's side of the zygotes (harness.cell.zygote): one process per arm that
imported the arm's packages once and forks each of its cells' workers.

Requests and replies are JSON lines on two pipes (harness.contract.zygote_request). A zygote
whose imports failed stays, not ready, so its arm's cells run the plain way (and record the
failure); one that died is started again at its arm's next cell.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.contract import ZYGOTE_MODULE, CellRun, zygote_args, zygote_request
from harness.store.layout import RunStore
from harness.system.reaper import REAPER, die_with_parent, raise_if_signalled

READY_TIMEOUT_S = 300
"""How long the parent waits for a zygote's imports (MaxText's take ~10 s on 2 cores)."""
REPLY_TIMEOUT_S = 60
"""How long a fork or the exit report of a killed child may take to be answered."""


class ZygoteError(RuntimeError):
    """The zygote is gone (it died, or its pipes broke)."""


class _NoAnswerError(ZygoteError):
    """The zygote did not answer within the time allowed."""


class Zygote:
    """The parent's handle on one zygote process (one arm, one environment)."""

    def __init__(self, arm: str, plugins: tuple[str, ...], env: dict[str, str], log: Path,
                 cwd: Path | None = None):
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        command = [sys.executable, "-m", ZYGOTE_MODULE,
                   *zygote_args(arm, plugins, requests_r, replies_w)]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                         stdout=out, stderr=subprocess.STDOUT,
                                         pass_fds=(requests_r, replies_w),
                                         start_new_session=True,
                                         preexec_fn=die_with_parent(os.getpid()))
        os.close(requests_r)
        os.close(replies_w)
        self._watch = REAPER.watch("group", pgid=self.proc.pid)
        self._watch.__enter__()
        self._requests = os.fdopen(requests_w, "w")
        self._replies, self._buffer = replies_r, b""
        self.env, self.log, self.ready_s, self.error = env, log, None, None
        self.forked = 0
        """Children forked so far."""
        self._started = False

    def start(self) -> Zygote:
        """Waits for the zygote's imports (started with the process); returns self. A zygote
        whose imports failed is closed, with `error` saying why."""
        if self._started:
            return self
        self._started = True
        try:
            hello = self._read(time.monotonic() + READY_TIMEOUT_S)
        except ZygoteError as err:
            hello = {"error": str(err)}
        self.ready_s, self.error = hello.get("ready"), hello.get("error")
        if self.error:
            self.close()
        return self

    @property
    def ready(self) -> bool:
        """It imported its arm's packages and still runs."""
        return self.ready_s is not None and self.proc.poll() is None

    def _read(self, deadline: float) -> dict:
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _NoAnswerError(f"did not answer in time (log: {self.log})")
            readable, _, _ = select.select([self._replies], [], [], min(left, 0.2))
            if not readable:
                raise_if_signalled()  # a stop that landed in another thread (the pool)
                continue
            chunk = os.read(self._replies, 65536)
            if not chunk:
                raise ZygoteError(f"exited (code {self.proc.poll()}; log: {self.log})")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def spawn(self, cell: str, out: Path, log: Path, env: dict[str, str]) -> int:
        """Forks a worker for `cell` (CellRun JSON): its record goes to `out`, its stdout and
        stderr to `log`, `env` is added to its environment. Returns its pid (and group)."""
        try:
            self._requests.write(zygote_request(cell, str(out), str(log), env))
            self._requests.flush()
        except OSError as err:
            raise ZygoteError(f"cannot be reached: {err}") from err
        self.forked += 1
        return self._read(time.monotonic() + REPLY_TIMEOUT_S)["pid"]

    def wait(self, timeout_s: float) -> tuple[int | None, int | None]:
        """(exit code, peak RSS bytes) of the last child, or (None, None) at the timeout."""
        try:
            ended = self._read(time.monotonic() + timeout_s)
        except _NoAnswerError:
            return None, None
        return ended["code"], ended["max_rss"]

    def reap(self, pid: int) -> tuple[int | None, int | None]:
        """Kills the child's group and takes its exit report (the next request needs the
        protocol in step): (exit code, peak RSS bytes)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        ended = self._read(time.monotonic() + REPLY_TIMEOUT_S)
        return ended["code"], ended["max_rss"]

    def close(self) -> None:
        """Ends the zygote (end of file on its requests) and its group; once."""
        if self._replies is None:
            return
        with contextlib.suppress(OSError):
            self._requests.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        os.close(self._replies)
        self._replies = None
        self._watch.__exit__(None, None, None)


class Zygotes:
    """The zygotes of one grid, one per arm (and plugins). All start together when the grid
    does, and the first cell runs once every one has imported (no import competes with a
    timed window; 2 cores import two at a time); they end with the grid. A zygote whose
    imports failed stays, not ready, so its arm's cells run the plain way (and record the
    failure); one that died is started again at its arm's next cell. `alongside` runs while
    they import."""

    def __init__(self, store: RunStore, env: dict[str, str], cwd: Path | None,
                 cells: Sequence[CellRun] | None, alongside: Callable[[], None] | None = None):
        self.store, self.env, self.cwd = store, env, cwd
        self.live: dict[tuple, Zygote] = {}
        try:
            for cell in cells or ():
                if zygote_key(cell) not in self.live:
                    self.live[zygote_key(cell)] = self._new(cell)
            if alongside is not None:
                alongside()
            for zygote in self.live.values():
                zygote.start()
        except BaseException:  # a stop while they import: none is left behind
            self.__exit__()
            raise

    def _new(self, cell: CellRun) -> Zygote:
        log = self.store.zygote_log(cell.arm, len(self.live))
        return Zygote(cell.arm, tuple(cell.plugins), self.env, log, self.cwd)

    def get(self, cell: CellRun) -> Zygote | None:
        zygote = self.live.get(zygote_key(cell))
        if zygote is None:
            return None
        if zygote.error is None and not zygote.ready:  # it died: a new one for this cell
            zygote.close()
            zygote = self.live[zygote_key(cell)] = self._new(cell).start()
        return zygote

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for zygote in self.live.values():
            zygote.close()


def zygote_key(cell: CellRun) -> tuple:
    """What one zygote serves: an arm and the plugins imported before it."""
    return cell.arm, tuple(cell.plugins)
