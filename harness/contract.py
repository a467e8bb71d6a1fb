"""The contract between the parity parent (harness.orchestrator) and a cell worker
(harness.cell): what one side hands the other, and nothing else.

The parent starts a worker as `python -m WORKER_MODULE` with the arguments `worker_args`
builds, or forks one from a zygote (`python -m ZYGOTE_MODULE`) with the same arguments; the
worker writes its record (or, with `--slices`, a list of records) as JSON to `--out` and
exits. Neither side imports the other: they meet through argv, environment variables, the
files named here and, in lockstep, a socket (the gate), so the parent can drive the worker
of another commit (`parity ab`). This module imports the standard library only.

`PROTOCOL` is the version of this contract a worker speaks; `python -m WORKER_MODULE
--protocol` prints it. Version 4: the worker reads the gradient the parity check needs from
the optimizer's own state and adds nothing to the trainer's program; `CellRun.capture` is
read only by workers of version 3, which chained a gradient capture into the timed step
where it was True (the parent sends False: such a worker times its trainer's own program,
and checks no parity). Version 3: `CellRun.capture` (a worker of version 2 always builds the
capture). Version 2: the worker is `harness.cell`, in-process pairing (`--slices`) and
lockstep (`--gate-fd`) included. Commits before this module have a
worker `harness.worker` with the same arguments (version 1 where it has `--gate-fd`, 0
before); `harness.orchestrator.refs` tells them apart by their git ancestry.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json

PROTOCOL = 4
CAPTURE_PROTOCOL = 3
"""The first protocol whose worker reads `CellRun.capture` (workers before it always chain
the gradient capture into the step they time)."""
TRAINER_ONLY_PROTOCOL = 4
"""The first protocol whose worker times only the trainer's own program, parity checked or
not (`CellRun.capture` is sent to a worker of CAPTURE_PROTOCOL as False for the same)."""
WORKER_MODULE = "harness.cell"
ZYGOTE_MODULE = "harness.cell.zygote"

STEP_ANNOTATION = "train"
"""The name of the `StepTraceAnnotation` around each traced step: the worker writes it,
the trace reader finds steps by it."""

PROCESSES, IN_PROCESS, LOCKSTEP = "processes", "in-process", "lockstep"
"""How cells share the machine while timed (`--pairing`): every cell in processes of its
own, one after the other; the arms of a shape in one process, timed in alternating slices;
two commits' processes of a cell side by side, their slices alternating on the parent's
signal (`parity ab`)."""

OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "MemoryError")
"""What XLA (any backend) and Python say when an allocation fails."""
PEER_MARKERS = ("stopped sending heartbeats", "Gloo context initialization failed",
                "Connection closed by peer", "Connection reset by peer")
"""What one process of a multi-process cell sees when another has gone: the coordination
service's heartbeat check aborting it, or gloo failing to reach the peer at its first
collective (context setup) or mid-transfer."""

SPAWNED_AT = "PARITY_SPAWNED_AT"
"""Environment variable: time.time() when the parent started the worker's process, from
which the worker's `start` phase (interpreter start-up until its first line) is measured. A
variable rather than a CellRun field, so a worker of an older commit ignores it."""
COMPILE_CACHE = "PARITY_COMPILE_CACHE"
"""Environment variable: the directory of the JAX persistent compilation cache a worker
shares with the other cells of its arm; unset: every compile is cold."""
REFERENCE_DIR = "PARITY_REFERENCE_DIR"
"""Environment variable: where the exact reference gradients are kept (harness.cell.
reference_store): computed by the first cell that needs one, read by every other arm and
every later run pointed at the same directory; unset: every cell computes its own."""
REFERENCE_BOUND = "PARITY_REFERENCE_BOUND_GB"
"""Environment variable: the size bound of the reference store in GB (its default:
harness.cell.reference_store.DEFAULT_BOUND_GB)."""

WORKER_NAME = b"parity-worker"
"""A worker forked from a zygote names its process this (/proc/PID/comm, what ps and top
show): its command line stays the zygote's."""

READY, GO, DONE = b"r", b"g", b"d"
"""Lockstep's messages over the gate socket (one byte each): the worker sends READY once
built and warm, then for each slice waits for GO, times its steps and sends DONE; after its
last slice it waits until the parent closes its end."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRun:
    """One cell as the parent hands it to a worker."""

    arm: str
    """Arm name (arms.registry.resolve)."""
    spec: dict
    """arms.spec.CellSpec as a dict."""
    steps: int = 10
    """Timed steps."""
    warmup: int = 3
    """Untimed steps before timing (>= 1: a first step allocates what later ones reuse)."""
    trace: bool = False
    """Capture and parse a separate traced window after timing."""
    trace_steps: int = 3
    """Steps in the traced window."""
    trace_dir: str | None = None
    """Root directory of the traces (None: the temp dir); the capture goes to a directory of
    its own below it (`trace_session`)."""
    trace_session: str | None = None
    """Path of this cell's capture below `trace_dir`, set by the parent
    (harness.store.layout.cell_path), with `-2`, `-3`, ... appended where it exists; None:
    a fresh random `trace-*` directory."""
    trace_hlo: bool = False
    """Capture the traced window with each module's HLO proto, which xprof's memory_viewer
    and graph_viewer need (~1.5x bigger trace files)."""
    parity: bool = True
    """Compare the first step's captured gradient with the exact reference."""
    capture: bool = False
    """Read only by a worker of protocol 3 (CAPTURE_PROTOCOL), which chains the gradient
    capture in front of the optimizer of the step it times where this is True; always sent
    (`cell_json`), as False, so such a worker times the trainer's own program as later
    workers do (and checks no parity). A worker of TRAINER_ONLY_PROTOCOL on ignores it."""
    plugins: tuple[str, ...] = ()
    """Modules to import first (they may register extra arms, e.g. test-only ones)."""
    distributed: dict | None = None
    """jax.distributed settings: {"coordinator", "num_processes", "process_id"} (or
    {"auto": True} where JAX detects the cluster, e.g. Cloud TPU); None = one process."""
    heartbeat_s: int = 30
    """jax.distributed heartbeat timeout: how long a dead peer goes unnoticed."""
    plan_target: str | None = None
    """Plan the cell for this TPU topology instead of running it (harness.cell.plan)."""
    plan_slices: int = 1
    """Slices of `plan_target`."""
    plan_libtpu: str | None = None
    """The libtpu version the parent's probe found (recorded with the plan)."""
    plan_hlo_dir: str | None = None
    """Where a plan writes each executable's optimized HLO text (`<executable>.hlo.txt`)."""
    plan_cache: str | None = None
    """The plan cache directory (harness.cell.plan); None: every executable is compiled."""
    fit_check: bool = True
    """Before building anything, plan the cell's step for its device and refuse it there if
    its planned peak exceeds what a device may use (harness.cell.fit): on an accelerator,
    and on CPU where `fit_bytes` names a limit."""
    fit_bytes: int | None = None
    """The bytes one device may use, for the fit check; None: the device's own limit
    (`memory_stats()['bytes_limit']`; the CPU backend states none, so no check there)."""


CHECK_PENDING = "the check did not end"
"""What a worker's record says of its gradient check (`Record.parity_not_checked`) while the
check runs: the worker writes its measured record before the check and again after it, so a
check that ends the process (killed at the timeout, out of host memory, a crash) leaves the
measurements, and the parent replaces this with how the process ended."""


def cell_hash(spec: dict) -> str:
    """The identity of a cell's work: 16 hex digits of the sha256 of its spec as canonical
    JSON. Records with equal hashes were given the same work."""
    blob = json.dumps(spec, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def progress_file(out: str) -> str:
    """Where a worker writing its record to `out` notes each phase as it ends ("name
    seconds" lines), so the parent can say where a cell it killed at its timeout was."""
    return f"{out}.progress"


ALWAYS_SENT = ("capture",)
"""CellRun fields written even at their default: a worker of an older protocol defaults
`capture` to True."""


def cell_json(cell: CellRun) -> str:
    """`cell` as the worker's --cell JSON: the fields that differ from their defaults, so a
    worker of an older commit that lacks a newer field still reads it."""
    defaults = {f.name: f.default for f in dataclasses.fields(CellRun)}
    data = dataclasses.asdict(cell)
    return json.dumps({k: v for k, v in data.items()
                       if defaults[k] is dataclasses.MISSING or v != defaults[k]
                       or k in ALWAYS_SENT})


def cell_from_json(data: dict) -> CellRun:
    """The CellRun of one --cell JSON object (a list of them with --slices)."""
    data = dict(data)
    if "plugins" in data:
        data["plugins"] = tuple(data["plugins"])
    return CellRun(**data)


def worker_args(cells: str, out: str, *, slices: int = 0, gate_fd: int = -1) -> list[str]:
    """The worker's arguments: `cells` is one cell's JSON (`cell_json`), or with `slices`
    a JSON list of one shape's cells timed in that many alternating slices in one process;
    with `gate_fd`, a socket the parent times the slices through (lockstep)."""
    args = ["--cell", cells, "--out", out]
    if slices:
        args += ["--slices", str(slices)]
    if gate_fd >= 0:
        args += ["--gate-fd", str(gate_fd)]
    return args


def worker_parser() -> argparse.ArgumentParser:
    """The worker's command line (what `worker_args` builds)."""
    parser = argparse.ArgumentParser(prog=f"python -m {WORKER_MODULE}",
                                     description="Runs parity cells (used by `parity run`).")
    parser.add_argument("--protocol", action="store_true",
                        help="print the contract version this worker speaks, and exit")
    parser.add_argument("--cell", help="CellRun as JSON (with --slices, a JSON list)")
    parser.add_argument("--out", help="file the record JSON is written to")
    parser.add_argument("--slices", type=int, default=0,
                        help="time --cell's cells in this many alternating slices in this "
                        "process; the records go to --out as a JSON list")
    parser.add_argument("--gate-fd", type=int, default=-1,
                        help="with --slices: a socket the parent times the slices through "
                        "(lockstep): READY after warmup, each slice on GO, DONE after it")
    return parser


def zygote_args(arm: str, plugins: tuple[str, ...], requests_fd: int,
                replies_fd: int) -> list[str]:
    """The zygote's arguments: the arm whose packages it imports, the pipes it reads
    requests from and writes replies to (JSON lines, `zygote_request`)."""
    return ["--arm", arm, *(f"--plugin={p}" for p in plugins), "--requests",
            str(requests_fd), "--replies", str(replies_fd)]


def zygote_request(cell: str, out: str, log: str, env: dict[str, str]) -> str:
    """One fork request: the child runs the worker on `cell` (CellRun JSON), writing its
    record to `out` and its output to `log`, with `env` added to its environment. The
    zygote replies {"pid"} at the fork and {"pid", "code", "max_rss"} at the child's exit;
    at start it replies {"ready": seconds} or {"error": message}."""
    return json.dumps({"cell": cell, "out": out, "log": log, "env": env}) + "\n"


def slice_order(arms: int, index: int) -> list[int]:
    """The arms' order in slice `index`: rotated by one each slice (A B C, B C A, C A B).
    Every arm takes every place equally often, and no arm runs twice in a row across
    slices with 3+ arms (with 2, each repeats equally: A B, B A). Reversing instead (A B C,
    C B A) would let the outer arms run twice in a row, warm, and never the middle one:
    measured, a middle copy of `native` ran 4% apart from the same code outside it."""
    return [(index + j) % arms for j in range(arms)]
