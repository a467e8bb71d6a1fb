"""What a long-running command leaves behind is removed even when it is killed.

A `parity run`/`ab`/`nightly` parent owns cell workers (each in its own process group, so a
timeout can kill the cell and anything it started), their temporary directories and, for
`ab`, two git worktrees. Three layers make sure none of it outlives the parent:

1. SIGTERM and SIGHUP (what `timeout`, a CI cancel or a closed terminal send) raise
   `Terminated` in the parent, so the same `finally` blocks that serve Ctrl-C run: the cell's
   group is killed, its temp dir removed, the worktrees removed.
2. Every worker asks the kernel to SIGKILL it when its parent dies (`die_with_parent`,
   Linux's PR_SET_PDEATHSIG): a worker never runs on for a parent killed with SIGKILL.
3. The parent registers each group, directory and worktree with a *reaper*: a small process
   in its own session that reads the registrations from a pipe. The pipe reaches end of file
   only when the parent is gone; the reaper then kills what is still registered and removes
   it. A parent that finishes normally has unregistered everything, so its reaper exits with
   nothing to do.

`python -m harness.system.reaper` is the reaper itself; it imports only the standard library
(and harness.system.git, which does too), so it starts in tens of milliseconds.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from harness.system.git import REPO, remove_worktree

PR_SET_PDEATHSIG = 1


class Terminated(BaseException):
    """The parent received SIGTERM or SIGHUP; unwinds like KeyboardInterrupt."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_received: list[int] = []
"""Signals received inside `terminate_on_signals` and not yet acted on."""


def _stop(signum: int) -> BaseException:
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signum)


def _raise_stop(signum, frame):
    _received.append(signum)
    raise _stop(signum)


def raise_if_signalled() -> None:
    """Raises the stop for a signal whose exception was swallowed where it landed: Python
    ignores an exception raised in a finalizer or an at-fork hook (seen: SIGINT during the
    fork of a cell's worker), so a run loop calls this between cells."""
    if _received:
        raise _stop(_received[-1])


@contextlib.contextmanager
def terminate_on_signals() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt, SIGTERM and SIGHUP `Terminated`, inside the block;
    each is also remembered for `raise_if_signalled` (handlers restored on exit)."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, _raise_stop) for s in signals}
    try:
        yield
    finally:
        _received.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def die_with_parent(parent_pid: int):
    """A `preexec_fn` for Popen: the child gets SIGKILL when `parent_pid` dies (Linux; a no-op
    elsewhere). The parent may already be gone between fork and prctl, hence the pid check."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


class Reaper:
    """The parent's side: registers what the reaper must remove should the parent die."""

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # cells side by side register from threads

    def _send(self, message: dict) -> None:
        with self._lock:
            if self._proc is None:
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "harness.system.reaper"], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()

    @contextlib.contextmanager
    def watch(self, kind: str, **what) -> Iterator[None]:
        """Registers `what` (kind "group": pgid; "path": path; "worktree": path, repo) for
        the duration of the block."""
        entry = {"kind": kind, **what}
        self._send({"add": entry})
        try:
            yield
        finally:
            self._send({"remove": entry})

    def close(self) -> None:
        """Ends a reaper that has nothing left to do (normal exit of the parent)."""
        if self._proc is not None:
            self._proc.stdin.close()
            self._proc.wait()
            self._proc = None


REAPER = Reaper()
"""This process's reaper (started by its first registration)."""


# ------------------------------------------------------------------------ the reaper process
def _key(entry: dict) -> str:
    return json.dumps(entry, sort_keys=True)


def _clean(entries: list[dict]) -> None:
    """Kills every registered group, then removes worktrees and directories."""
    for entry in entries:
        if entry["kind"] == "group":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry["pgid"], signal.SIGKILL)
    for entry in entries:
        if entry["kind"] == "group":  # the kernel frees their files once they are gone
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and group_alive(entry["pgid"]):
                time.sleep(0.05)
    for entry in entries:
        if entry["kind"] == "worktree":
            remove_worktree(Path(entry["path"]), Path(entry["repo"]))
    for entry in entries:
        if entry["kind"] in ("path", "worktree"):
            path = Path(entry["path"])
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()


def group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. Zombies do not count: a worker whose
    parent died is re-parented to pid 1, which in a container may never reap it."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: signal 0 reaches zombies too, so this is an upper bound
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return True
    return False


def main() -> int:
    # The parent's Ctrl-C or SIGTERM is not ours: we act when its pipe closes.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    live: dict[str, dict] = {}
    for line in sys.stdin.buffer:
        message = json.loads(line)
        if "add" in message:
            live[_key(message["add"])] = message["add"]
        else:
            live.pop(_key(message["remove"]), None)
    _clean(list(live.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
