"""A worker process's life, seen from the parent: started in a process group of its own
that dies with the parent, waited for with its peak memory, and its end turned into records
(`records_of`): the one path from a process's exit to a record, whatever ran in it (one
cell, one shape's paired arms, one side of a lockstep pair, a child a zygote forked).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.contract import (
    CHECK_PENDING,
    OOM_MARKERS,
    PEER_MARKERS,
    SPAWNED_AT,
    WORKER_MODULE,
    progress_file,
)
from harness.system.reaper import REAPER, die_with_parent, group_alive, raise_if_signalled
from reports.record import Failure, Record

STDERR_TAIL = 4000
STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
"""The signals that stop a run (harness.system.reaper.terminate_on_signals)."""


def oom_kills() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (v2 `memory.events`,
    else v1 `memory.oom_control`); None where neither is readable."""
    candidates = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0":
                candidates.append(Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events"))
            elif "memory" in controllers.split(","):
                candidates += [Path("/sys/fs/cgroup/memory", path.lstrip("/"),
                                    "memory.oom_control"),
                               Path("/sys/fs/cgroup/memory/memory.oom_control")]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            for line in candidate.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


class OomWatch:
    """OOM kills the kernel counts in this cgroup between `start` and `kills()`: whatever
    process of the parent's a kill took, a worker SIGKILLed meanwhile may have been it."""

    def __init__(self):
        self._before = oom_kills()

    def kills(self) -> int:
        after = oom_kills()
        return after - self._before if self._before is not None and after is not None else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exit:
    """How a worker process ended, as the parent saw it."""

    code: int | None
    """Exit status (negative: killed by that signal); None when the parent killed it at
    its timeout."""
    stderr: str
    wrote_record: bool
    max_rss_bytes: int | None = None
    """The process's peak resident memory (from wait4)."""
    oom_kills: int = 0
    """OOM kills the kernel counted in this cgroup while the worker ran."""
    progress: str = ""
    """The phases the worker ended, as it noted them (harness.contract.progress_file)."""

    @classmethod
    def of(cls, code: int | None, max_rss: int | None, out: Path, err: Path,
           oom: OomWatch) -> Exit:
        """How the worker that wrote (or not) `out` and its output to `err` ended, with
        the OOM kills `oom` counted meanwhile."""
        progress = Path(progress_file(str(out)))
        return cls(code=code, stderr=read_stderr(err), wrote_record=out.exists(),
                   max_rss_bytes=max_rss, oom_kills=oom.kills(),
                   progress=progress.read_text() if progress.exists() else "")


def failure(reason: str, message: str, stderr: str) -> Record:
    """A failed record: `reason`, `message` and the tail of the worker's output."""
    return Record(status="failed", error=Failure(reason=reason, message=message,
                                                 stderr_tail=stderr[-STDERR_TAIL:]))


_FATAL = re.compile(r"^F\d{4} [^\]]*\] (.*)$", re.MULTILINE)
"""A glog FATAL line (XLA's and libtpu's CHECK failures): 'F1202 06:11:09.35 ... file.cc:123]
Check failed: ...'."""


def where_it_was(progress: str, elapsed_s: float) -> str:
    """'; phases ended: start 1.2 s, imports 3.0 s, build 4.1 s; the next ran 591.7 s
    without ending' from a worker's progress notes ('' without notes)."""
    ended = [line.split() for line in progress.splitlines() if len(line.split()) == 2]
    if not ended:
        return "; it ended no phase (stuck starting or importing)"
    done = sum(float(seconds) for _, seconds in ended)
    listed = ", ".join(f"{name} {float(seconds):.1f} s" for name, seconds in ended)
    return (f"; phases ended: {listed}; the next ran {max(0.0, elapsed_s - done):.1f} s "
            "without ending")


def classify(ended: Exit, timeout_s: float) -> Record | None:
    """The failure record of a worker that wrote no record (None if it wrote one)."""
    if ended.wrote_record:
        return None
    stderr, code = ended.stderr, ended.code
    if code is None:
        return failure("timeout", f"cell exceeded its {timeout_s:.0f} s timeout"
                       f"{where_it_was(ended.progress, timeout_s)}", stderr)
    if any(marker in stderr for marker in PEER_MARKERS):
        return failure("peer-died", "another process of this multi-process cell died "
                                     "(no heartbeats, or gloo lost it); this one stopped "
                                     "instead of hanging", stderr)
    rss = (f"; its peak RSS was {ended.max_rss_bytes / 2**30:.2f} GiB"
           if ended.max_rss_bytes else "")
    if code == -signal.SIGKILL and ended.oom_kills:
        return failure("oom", f"cell process was killed by the kernel's OOM killer{rss}",
                        stderr)
    if any(marker in stderr for marker in OOM_MARKERS):
        return failure("oom", f"cell ran out of memory (exit code {code}){rss}", stderr)
    if code == -signal.SIGKILL:
        return failure("killed", f"cell process was killed (SIGKILL from outside the "
                                  f"harness; the OOM killer leaves no count here){rss}", stderr)
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"exited with code {code}")
    fatal = _FATAL.findall(stderr)  # what XLA (or libtpu) said as it aborted
    said = f"; it said: {fatal[-1].strip()[:300]}" if fatal else ""
    return failure("crash", f"cell process {how} without a record{said}", stderr)


def records_of(ended: Exit, out: Path, timeout_s: float, count: int, where: str,
               elapsed_s: float) -> list[Record]:
    """The records a worker's end leaves: the `count` records it wrote to `out` (one JSON
    object, or a list with --slices), each failed one given the worker's stderr tail; or,
    where it wrote none, the failure its end stands for, once per record it owed."""
    failure = classify(ended, timeout_s)
    if failure is not None:
        records = [dataclasses.replace(failure) for _ in range(count)]
    else:
        data = json.loads(out.read_text())
        records = [Record.from_json(item, f"{where} ({k + 1} of {count})" if count > 1
                                    else where, whole=False)
                   for k, item in enumerate(data if isinstance(data, list) else [data])]
        if len(records) != count:
            raise ValueError(f"{where}: the worker wrote {len(records)} records for {count} "
                             "cells")
        for record in records:
            if record.error:
                record.error.stderr_tail = ended.stderr[-STDERR_TAIL:]
            if record.parity_not_checked == CHECK_PENDING:
                record.parity_not_checked = check_ended(ended, timeout_s)
    for record in records:
        record.wall_s = elapsed_s
    return records


def check_ended(ended: Exit, timeout_s: float) -> str:
    """Why the gradient check of a worker that ended inside it gave no verdict: the failure
    its process's end stands for ('timeout: ...', 'oom: ...', 'crash: ...'); the record it
    wrote before the check keeps the measurements."""
    failed = classify(dataclasses.replace(ended, wrote_record=False), timeout_s)
    message = failed.error.message.replace(" without a record", "")
    return f"{failed.error.reason}: {message}"


def read_stderr(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS bytes): waits with wait4 for its rusage."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024  # KiB on Linux
        if time.monotonic() >= deadline:
            return None, None
        raise_if_signalled()  # a stop that landed in another thread (the pool)
        time.sleep(0.05)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """Holds SIGINT, SIGTERM and SIGHUP in this thread for the block: one that arrives in it
    lands as it ends. Work that must not be cut in two (a process started, then registered
    where the way out will kill it) goes inside."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


@contextlib.contextmanager
def started_worker(args: list[str], env: dict[str, str], err_path: Path, cwd: Path | None,
                   pass_fds: Sequence[int] = (), module: str | None = None,
                   python: str | None = None) -> Iterator[subprocess.Popen]:
    """Yields the Popen of `python -m MODULE ARGS` (the cell worker; an older commit's
    worker module where `module` names it; in the interpreter `python`, else this one),
    started in a process group of its own that dies with this process, its output going to
    `err_path`, `pass_fds` kept open in it; on leaving (the worker's end, a timeout, SIGINT
    or SIGTERM) the group is taken down and the process reaped."""
    command = [python or sys.executable, "-m", module or WORKER_MODULE, *args]
    env = {**env, SPAWNED_AT: repr(time.time())}
    parent = os.getpid()

    def child_setup() -> None:  # the worker starts with the stops unblocked again
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)
        die_with_parent(parent)()

    with err_path.open("w") as stderr:
        # A stop (SIGTERM, SIGINT, SIGHUP) that arrived between the fork and the cleanup's
        # registration would leave the worker running while the parent removes the temp dirs
        # it writes into: stops are held until the worker is registered, then land inside.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            proc = subprocess.Popen(command, env=env, stdout=stderr, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=cwd, pass_fds=tuple(pass_fds),
                                    preexec_fn=child_setup)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        try:
            with REAPER.watch("group", pgid=proc.pid):
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                yield proc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            kill_group(proc.pid)
            if proc.returncode is None:
                proc.wait()
            _wait_group_gone(proc.pid)


def kill_group(pgid: int) -> None:
    """SIGKILL to every process of group `pgid` (a worker and what it started)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _wait_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """Waits until no live process of group `pgid` is left: SIGKILL is delivered
    asynchronously, and a process the worker started may outlive it by a moment; the temp
    dirs the group writes into are removed after it, not before."""
    deadline = time.monotonic() + timeout_s
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


@contextlib.contextmanager
def worker_dir(prefix: str) -> Iterator[Path]:
    """A temp dir for a worker's record and output, removed after it (and by the reaper
    should the parent be killed)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp, REAPER.watch("path", path=tmp):
        yield Path(tmp)
