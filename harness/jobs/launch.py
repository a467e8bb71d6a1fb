"""`parity launch -n N -- RUN ARGS`: N local processes of one multi-process `parity run`,
meeting as one jax.distributed job (process 0 writes the records)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.system.reaper import REAPER, Terminated, die_with_parent, terminate_on_signals


class LaunchStopped(Exception):  # noqa: N818 - a stop, not a fault
    """The launch was stopped by a signal; `code` is the exit status (130, 143, ...)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def launch(n: int, run_args: list[str]) -> tuple[int, list[str]]:
    """(exit code, what the other processes said when they failed): `parity run RUN_ARGS`
    started `n` times on this machine, on a free local port. A stop (SIGINT, SIGTERM)
    stops every process, each cleaning up after itself, and raises LaunchStopped."""
    if n < 1:
        raise ValueError(f"launch -n {n}: give at least 1 process")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="parity-launch-") as tmp, \
            REAPER.watch("path", path=tmp):  # removed even if this process is killed
        logs = [None] + [open(Path(tmp) / f"{i}.err", "w+") for i in range(1, n)]  # noqa: SIM115
        procs = [subprocess.Popen(
            [sys.executable, "-m", "harness.cli", "run", *run_args, "--num-processes",
             str(n), "--process-id", str(i), "--coordinator", f"127.0.0.1:{port}",
             "--run-id", f"launch-{port}"],
            stdout=None if i == 0 else subprocess.DEVNULL, stderr=logs[i],
            preexec_fn=die_with_parent(os.getpid())) for i in range(n)]
        try:
            with terminate_on_signals():
                codes = [p.wait() for p in procs]
        except (KeyboardInterrupt, Terminated) as stop:
            _stop(procs)
            raise LaunchStopped(getattr(stop, "exit_code", 130)) from None
        said = []
        if codes[0] == 0:  # process 0 reports its own failure; the others', once
            for i, code in enumerate(codes[1:], 1):
                if code:
                    logs[i].seek(0)
                    tail = logs[i].read().strip().splitlines()[-1:] or ["(no output)"]
                    said.append(f"process {i} exited {code}: {tail[0]}")
        for log in logs[1:]:
            log.close()
    return (codes[0] if codes[0] else max(codes)), said


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:  # each one cleans up after itself on SIGTERM
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
