"""xplane capture and parse: executions per step, device-busy time and host time per step.

What a capture holds is read by `harness.measure.xplane` (XLA:CPU's host ops; a TPU's module and op
lines; a GPU's kernel and copy events tied to the host's dispatches by correlation id);
steps are the `StepTraceAnnotation` events on the host's python line.

On disk (`capture`): `<trace root>/<run id>/<cell>/plugins/profile/<timestamp>/<host>.xplane.pb`,
where `<cell>` is `<arm>-<preset>-s<seq>-b<batch>-ga<ga>` (harness.store.layout.cell_path).
Any directory above `plugins/` is a logdir xprof and TensorBoard's profile plugin open: a cell's,
or a whole run's (the cells then appear as `<cell>/<timestamp>` sessions).
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import tempfile
from collections.abc import Iterator

import jax

from harness.measure import xplane


@dataclasses.dataclass(frozen=True)
class StepTrace:
    step: int
    executions: int
    """Distinct (hlo_module, program_id, run_id) executed inside the step's annotation."""
    modules: tuple[str, ...]
    """hlo_module name of each execution, in start order."""
    wall_ns: float
    """Duration of the step annotation."""
    busy_ns: float
    """Union of the executions' op intervals, each until the op completed (device-busy
    time; on CPU, compute threads)."""


def profiler_options(hlo: bool = False) -> jax.profiler.ProfileOptions:
    """What the profiler records. `hlo` adds each executed module's HLO proto to the trace:
    xprof's memory_viewer and graph_viewer read nothing else (without it they are absent
    from the tool list), at the price of ~1.5x bigger files."""
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # no Python call tracing: small, cheap traces
    options.enable_hlo_proto = hlo
    return options


@contextlib.contextmanager
def capture(logdir: str | None = None, *, session: str | None = None,
            hlo: bool = False) -> Iterator[str]:
    """Traces into a directory of its own under `logdir` (default: the temp dir) and yields it.

    With `session` (e.g. '<run id>/<cell>') that directory is `logdir/session`, or
    `session-2`, `-3`, ... when it exists: a rerun never writes into an earlier capture.
    Without, it is a fresh random `trace-*` directory. Either way one directory holds one
    capture: the profiler names its files by the second, so two captures in one second into
    one directory would collide.
    """
    parent = logdir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    if session:
        directory = claim_directory(os.path.join(parent, session))
    else:
        directory = tempfile.mkdtemp(prefix="trace-", dir=parent)
    with jax.profiler.trace(directory, profiler_options=profiler_options(hlo)):
        yield directory


def claim_directory(path: str) -> str:
    """Creates `path`, or the first of `path-2`, `path-3`, ... that does not exist, and
    returns it. `os.mkdir` fails when the directory exists, atomically, so two processes
    (a rerun, or the processes of one multi-process cell on one host) never share one."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    candidate, number = path, 1
    while True:
        try:
            os.mkdir(candidate)
            return candidate
        except FileExistsError:
            number += 1
            candidate = f"{path}-{number}"


def find_xplane(directory: str) -> str:
    found = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))
    if not found:
        raise FileNotFoundError(f"no .xplane.pb under {directory}")
    return found[-1]


def parse_steps(path: str) -> list[StepTrace]:
    """Per-step executions and busy time from one .xplane.pb file (harness.measure.xplane reads it:
    XLA:CPU's host ops, or the device planes' kernels). Busy time is the union, over every
    device, of the intervals of the step's ops (kernels; copies are not work), each until
    it completed; an execution belongs to the step its first op starts in."""
    capture = xplane.read(path)
    result = []
    for step, begin, end in capture.steps:
        inside = sorted((start, module) for start, module in capture.executions.values()
                        if begin <= start <= end)
        spans = [(op.start, min(op.end, end)) for op in capture.ops
                 if not op.memcpy and begin <= op.start <= end]
        result.append(StepTrace(step=step, executions=len(inside),
                                modules=tuple(m for _, m in inside), wall_ns=end - begin,
                                busy_ns=xplane.union_ns(spans)))
    return result


def summarize(path: str) -> dict:
    """What `parity trace --json` prints of one capture: per active device plane, busy,
    memcpy and span ms, executions (per module) and the top ops; per annotated step, wall
    and busy ms and executions."""
    capture = xplane.read(path)
    steps = parse_steps(path) if capture.steps else []
    return {"file": path, "devices": xplane.devices(capture),
            "steps": [{"step": s.step, "wall_ms": s.wall_ns / 1e6, "busy_ms": s.busy_ns / 1e6,
                       "executions": s.executions} for s in steps]}


LINE = 160
"""The widest line of a top-ops row (its whole instruction follows it with `full`)."""


def text(summary: dict, full: bool = False) -> str:
    """`summarize`'s result as a person reads it: a table of devices (each one's span split
    into compute, collectives, copies and idle: xplane.breakdown_ns), each one's top ops
    per step (one short line each; with `full`, each op's whole HLO instruction below it),
    and the steps."""
    lines = [f"capture: {summary['file']}", "",
             "| device | busy ms | memcpy ms | span ms | compute ms | collectives ms | copies ms "
             "| idle ms | executions | per module |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in summary["devices"]:
        modules = ", ".join(f"{m} x{n}" for m, n in d["modules"].items()) or "-"
        parts = " | ".join(f"{d['breakdown_ms'][k]:.3f}" for k in xplane.BREAKDOWN)
        lines.append(f"| {d['name']} | {d['busy_ms']:.3f} | {d['memcpy_ms']:.3f} | "
                     f"{d['span_ms']:.3f} | {parts} | {d['executions']} | {modules} |")
    if not summary["devices"]:
        lines.append("| (no device or XLA op events) |" + " - |" * 9)
    for d in summary["devices"]:
        lines += ["", _top_heading(d), "", "| ms/step | runs/step | op | category | shape |",
                  "|---|---|---|---|---|"]
        for op in d["top_ops"]:
            row = (f"| {op['ms_per_step']:.3f} | {op['runs_per_step']:g} | {op['name']} | "
                   f"{op['category']} | {op['shape'] or '-'} |")
            lines.append(row if len(row) <= LINE else row[:LINE - 5] + " ... |")
            if full and op["text"]:
                lines.append(f"|  |  | `{op['text']}` |  |  |")
    if summary["steps"]:
        lines += ["", "| step | wall ms | busy ms | executions |", "|---|---|---|---|"]
        lines += [f"| {s['step']} | {s['wall_ms']:.3f} | {s['busy_ms']:.3f} | "
                  f"{s['executions']} |" for s in summary["steps"]]
    else:
        lines += ["", "no step annotations: the whole capture is one window"]
    return "\n".join(lines)


def _top_heading(device: dict) -> str:
    """What the top-ops table of one device counts."""
    steps = device["steps"]
    per = f"per step ({steps} steps)" if steps > 1 else "in the capture (no step annotations)"
    return (f"top ops on {device['name']}, {per}: {device['ranked_ms'] / steps:.3f} ms of "
            f"{device['busy_ms'] / steps:.3f} busy\n(control flow that encloses its body, "
            "while, conditional and call, is not ranked: its time is its body's)")
