"""A template process that imports an arm's packages once and forks a fresh worker per cell.

Every cell runs in a process of its own, started with nothing but imports: no backend, no
compiled program, no memory statistics of another cell. Starting Python and importing the
stack is the same work for every round of a cell: from 1 s (jax, flax, optax) to 8-10 s
(MaxText's training engine pulls in transformers, tokamax and sympy) on a 2-core machine, a
third of a small cell's process. A zygote pays it once per arm and run: `python -m
harness.zygote` is started exactly as a worker would be (same environment, directory and
plugins), imports what its arm imports (`arms.registry.preload`: a Tunix or MaxText import
flips flax's `flax_always_shard_variable`, so one zygote serves one arm only), freezes its
heap's objects out of the garbage collector (a forked child then never copies their pages to
scan them) and forks one child per request. The child becomes a process-group leader that
dies with the zygote, which dies with the runner, points its stdout and stderr at the cell's
log and runs `harness.worker.main`; it is what a fresh `python -m harness.worker` would be
after its imports, before JAX starts a backend.

Requests and replies are JSON lines on two pipes of their own (an imported package may print
on stdout): the runner sends {"cell", "out", "log", "env"}; the zygote answers {"pid"} at
the fork and {"pid", "code", "max_rss"} when the child has exited (from wait4). At start it
answers {"ready": seconds} after its imports, or {"error": message} when they failed (the
runner then starts that arm's workers the plain way, which records the error per cell).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from harness.reaper import raise_if_signalled

READY_TIMEOUT_S = 300
"""How long the runner waits for a zygote's imports (MaxText's take ~10 s on 2 cores)."""
REPLY_TIMEOUT_S = 60
"""How long a fork or the exit report of a killed child may take to be answered."""


class ZygoteError(RuntimeError):
    """The zygote is gone (it died, or its pipes broke)."""


class _NoAnswerError(ZygoteError):
    """The zygote did not answer within the time allowed."""


def _reply(out, message: dict) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


WORKER_NAME = b"parity-worker"
"""The forked worker's process name (/proc/PID/comm, what ps and top show): its command line
stays the zygote's."""
PR_SET_NAME = 15


def _child(request: dict, zygote_pid: int, pipes: tuple[int, int]) -> None:
    """Runs in the forked child: becomes the cell's worker and never returns."""
    code = 1
    try:
        os.setsid()
        import ctypes

        from harness.reaper import die_with_parent

        die_with_parent(zygote_pid)()
        ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(WORKER_NAME), 0, 0, 0)
        for fd in pipes:
            os.close(fd)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(request["env"])
        from harness import worker

        code = worker.main(["--cell", request["cell"], "--out", request["out"]])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # the child must reach os._exit whatever happens
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(arm: str, plugins: list[str], requests_fd: int, replies_fd: int) -> int:
    requests = os.fdopen(requests_fd, "r")
    replies = os.fdopen(replies_fd, "w")
    start = time.perf_counter()
    try:
        import importlib

        for module in plugins:
            importlib.import_module(module)
        import jax  # noqa: F401 - every worker imports it; no backend is started here

        from arms.registry import preload

        preload(arm)
    except Exception as err:  # the plain worker will meet the same error and record it
        _reply(replies, {"error": f"{type(err).__name__}: {err}"})
        return 1
    gc.collect()
    gc.freeze()
    _reply(replies, {"ready": time.perf_counter() - start})
    for line in requests:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request, os.getppid(), (requests_fd, replies_fd))
        _reply(replies, {"pid": pid})
        _, status, usage = os.wait4(pid, 0)
        _reply(replies, {"pid": pid, "code": os.waitstatus_to_exitcode(status),
                         "max_rss": usage.ru_maxrss * 1024})  # KiB on Linux
    return 0


class Zygote:
    """The runner's handle on one zygote process (one arm, one environment)."""

    def __init__(self, arm: str, plugins: tuple[str, ...], env: dict[str, str], log: Path,
                 cwd: Path | None = None):
        from harness.reaper import REAPER, die_with_parent

        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        command = [sys.executable, "-m", "harness.zygote", "--arm", arm,
                   *(f"--plugin={p}" for p in plugins),
                   "--requests", str(requests_r), "--replies", str(replies_w)]
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
                raise_if_signalled()  # a stop that landed in another thread (harness.pool)
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
            self._requests.write(json.dumps({"cell": cell, "out": str(out), "log": str(log),
                                             "env": env}) + "\n")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Forks parity cell workers (used by "
                                                 "`parity run`).")
    parser.add_argument("--arm", required=True)
    parser.add_argument("--plugin", action="append", default=[])
    parser.add_argument("--requests", type=int, required=True, help="fd to read requests on")
    parser.add_argument("--replies", type=int, required=True, help="fd to write replies on")
    args = parser.parse_args(argv)
    return serve(args.arm, args.plugin, args.requests, args.replies)


if __name__ == "__main__":
    sys.exit(main())
