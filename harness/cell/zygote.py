"""The zygote: a template process that imports an arm's packages once and forks a fresh
worker per cell (`python -m harness.cell.zygote`; the parent's handle on it is
harness.orchestrator.zygote).

Every cell runs in a process of its own, started with nothing but imports: no backend, no
compiled program, no memory statistics of another cell. Starting Python and importing the
stack is the same work for every round of a cell: from 1 s (jax, flax, optax) to 8-10 s
(MaxText's training engine pulls in transformers, tokamax and sympy) on a 2-core machine, a
third of a small cell's process. A zygote pays it once per arm and run: `python -m
harness.cell.zygote` is started exactly as a worker would be (same environment, directory and
plugins), imports what its arm imports (`arms.registry.preload`: a Tunix or MaxText import
flips flax's `flax_always_shard_variable`, so one zygote serves one arm only), freezes its
heap's objects out of the garbage collector (a forked child then never copies their pages to
scan them) and forks one child per request. The child becomes a process-group leader that
dies with the zygote, which dies with the parent, points its stdout and stderr at the cell's
log and runs `harness.cell.worker.main`; it is what a fresh `python -m harness.cell` would be
after its imports, before JAX starts a backend.

Requests and replies are JSON lines on two pipes of their own (an imported package may print
on stdout; harness.contract.zygote_request): the parent sends {"cell", "out", "log", "env"};
the zygote answers {"pid"} at the fork and {"pid", "code", "max_rss"} when the child has
exited (from wait4). At start it answers {"ready": seconds} after its imports, or {"error":
message} when they failed (the parent then starts that arm's workers the plain way, which
records the error per cell).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback

from harness.contract import WORKER_NAME


def _reply(out, message: dict) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


PR_SET_NAME = 15


def _child(request: dict, zygote_pid: int, pipes: tuple[int, int]) -> None:
    """Runs in the forked child: becomes the cell's worker and never returns."""
    code = 1
    try:
        os.setsid()
        import ctypes

        from harness.system.reaper import die_with_parent

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
        from harness.cell import worker

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
