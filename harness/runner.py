"""Runs a grid: one subprocess per cell, a record per cell whatever happens to it."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import results
from harness.worker import CellRun
from reports.record import ABTag, Environment, Failure, Record, RunOptions, Spec, section

STDERR_TAIL = 4000


def cpu_env(cpu_devices: int | None, base: dict | None = None) -> dict[str, str]:
    """The environment cells run in; `cpu_devices` emulates that many CPU devices."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def probe(env: dict[str, str], timeout_s: float = 120) -> dict:
    """The environment cells will see (harness.environment), from a short subprocess."""
    proc = subprocess.run([sys.executable, "-m", "harness.environment"], env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"could not start JAX in a subprocess:\n{proc.stderr[-STDERR_TAIL:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _failure(reason: str, message: str, stderr: str) -> Record:
    return Record(status="failed", error=Failure(reason=reason, message=message,
                                                 stderr_tail=stderr[-STDERR_TAIL:]))


def run_one(cell: CellRun, env: dict[str, str], timeout_s: float,
            cwd: Path | None = None) -> Record:
    """Runs `cell` in a fresh process; never raises for what happens inside the cell."""
    with tempfile.TemporaryDirectory(prefix="parity-cell-") as tmp:
        out = Path(tmp) / "record.json"
        err_path = Path(tmp) / "stderr.txt"
        command = [sys.executable, "-m", "harness.worker", "--cell",
                   json.dumps(dataclasses.asdict(cell)), "--out", str(out)]
        start = time.perf_counter()
        with err_path.open("w") as stderr:
            # Own process group: a timeout kills the cell and anything it started.
            proc = subprocess.Popen(command, env=env, stdout=stderr, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=cwd)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                code = None
            except BaseException:  # SIGINT in the parent: take the cell down with it
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise
        stderr_text = err_path.read_text(errors="replace")
        elapsed = time.perf_counter() - start
        if code is None:
            record = _failure("timeout", f"cell exceeded its {timeout_s:.0f} s timeout",
                              stderr_text)
        elif out.exists():
            record = Record.from_json(json.loads(out.read_text()), f"cell {cell.arm}")
            if record.error:
                record.error.stderr_tail = stderr_text[-STDERR_TAIL:]
        elif "stopped sending heartbeats" in stderr_text:
            record = _failure("peer-died", "another process of this multi-process cell died "
                                           "(no heartbeats); this one stopped instead of "
                                           "hanging", stderr_text)
        elif code < 0 and -code == signal.SIGKILL:
            record = _failure("killed", "cell process was killed (SIGKILL: out of memory?)",
                              stderr_text)
        elif "RESOURCE_EXHAUSTED" in stderr_text or "Out of memory" in stderr_text:
            record = _failure("oom", f"cell ran out of memory (exit code {code})", stderr_text)
        else:
            how = (f"was killed by {signal.Signals(-code).name}" if code < 0
                   else f"exited with code {code}")
            record = _failure("crash", f"cell process {how} without a record", stderr_text)
    record.wall_s = elapsed
    return record


def schedule(cells: Sequence[CellRun], rounds: int) -> list[tuple[int, int, CellRun]]:
    """(round, cell index, cell) in run order: every cell once per round, the order reversed
    on odd rounds (A B C, C B A, ...) so slow drift of the machine reaches every cell alike.
    Only round 0 traces and checks parity (deterministic work; later rounds only time)."""
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: give at least 1 round")
    order = []
    for round_index in range(rounds):
        indices = range(len(cells)) if round_index % 2 == 0 else reversed(range(len(cells)))
        for index in indices:
            cell = cells[index]
            if round_index:
                cell = dataclasses.replace(cell, trace=False, parity=False)
            order.append((round_index, index, cell))
    return order


def new_run_id(prefix: str = "") -> str:
    """A timestamp to the microsecond: two runs started in the same second differ."""
    return prefix + datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")


def run_grid(cells: Sequence[CellRun], out_dir: str | Path, *, env: dict[str, str],
             timeout_s: float, run_id: str | None = None, suite: str | None = None,
             rounds: int = 1, on_record: Callable[[int, Record], None] | None = None,
             cwd: Path | None = None, ab: ABTag | None = None,
             environment: dict | None = None, distributed: dict | None = None,
             first_round: int = 0) -> tuple[Path, list[Record]]:
    """Runs every cell `rounds` times (interleaved, see `schedule`), appending each record to
    `out_dir/<run_id>.jsonl` as it finishes; returns the records in run order.

    `cwd` is where cells run (an A/B worktree); `ab` tags every record with its A/B side
    and `first_round` numbers its rounds; `environment` stands in for cells that died before
    writing their own. With `distributed` ({"coordinator": "HOST:PORT", "num_processes",
    "process_id"}) this is one host's runner: the k-th process of the run meets at PORT + k,
    and only process 0 writes records.
    """
    run_id = run_id or new_run_id()
    path = Path(out_dir) / f"{run_id}{'-' + suite if suite else ''}.jsonl"
    records = []
    writer = distributed is None or distributed.get("process_id", 0) == 0
    for k, (round_index, index, cell) in enumerate(schedule(cells, rounds)):
        if distributed:
            cell = dataclasses.replace(cell, distributed=_cell_distributed(distributed, k))
        if cell.trace:
            cell = dataclasses.replace(cell, trace_session=trace_session(
                run_id, cell, first_round + round_index))
        record = run_one(cell, env, timeout_s, cwd)
        record.run_id, record.suite, record.arm = run_id, suite, cell.arm
        record.round = first_round + round_index
        record.spec = section(Spec, cell.spec)
        record.config_hash = _config_hash(cell)
        record.run = RunOptions(steps=cell.steps, warmup=cell.warmup, trace=cell.trace,
                                trace_steps=cell.trace_steps, parity=cell.parity,
                                trace_hlo=cell.trace_hlo)
        record.timestamp = datetime.datetime.now(datetime.UTC).isoformat()
        record.ab = ab
        if record.environment is None and environment is not None:
            record.environment = section(Environment, environment)
        if writer:
            results.append(path, record)
        records.append(record)
        if on_record:
            on_record(index, record)
    return path, records


def trace_session(run_id: str, cell: CellRun, round_index: int = 0) -> str:
    """Where a cell's capture goes below the trace root:
    '<run id>/<arm>-<preset>-s<seq>-b<batch>-ga<ga>', with '-r<round>' for a round other than 0
    (only round 0 traces today).
    The grid varies only these keys within a run, so the name tells the cells apart; a cell
    listed twice gets '-2' from the capture (harness.trace.claim_directory)."""
    spec = cell.spec
    name = f"{cell.arm}-{spec['preset']}-s{spec['seq']}-b{spec['batch']}-ga{spec['ga']}"
    if round_index:
        name += f"-r{round_index}"
    return f"{_path_safe(run_id)}/{_path_safe(name)}"


def _path_safe(name: str) -> str:
    """`name` as one path component: a character that is not a letter, digit, '.', '_' or
    '-' (e.g. the ':' of an 'engine:maxtext' arm, a '/' in a run id) becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _cell_distributed(distributed: dict, index: int) -> dict:
    if distributed.get("auto"):
        return dict(distributed)
    host, port = distributed["coordinator"].rsplit(":", 1)
    return {**distributed, "coordinator": f"{host}:{int(port) + index}"}


def _config_hash(cell: CellRun) -> str:
    from arms.spec import CellSpec

    return CellSpec.from_dict(cell.spec).config_hash()
