"""xplane capture and parse: executions per step, device-busy time and host time per step.

Executions are counted from XLA's own events: every thunk/op event carries `hlo_module`,
`program_id` and `run_id` stats, and one (module, program, run) triple is one execution of
one executable. Steps are the `StepTraceAnnotation` events on the host's python line.

Layouts: on CPU there is no device plane; executions appear on host threads
(`/host:CPU`, lines such as `tf_XLAPjRtCpuClient/...` or the dispatching `python` line).
On accelerators xprof's schema puts ops on `/device:GPU:N` or `/device:TPU:N` planes (lines
"XLA Ops" / "XLA Modules"); that layout is read by the same code but awaits a run on
hardware to be confirmed.

On disk (`capture`): `<trace root>/<run id>/<cell>/plugins/profile/<timestamp>/<host>.xplane.pb`,
where `<cell>` is `<arm>-<preset>-s<seq>-b<batch>-ga<ga>` (harness.runner.trace_session). Any
directory above `plugins/` is a logdir xprof and TensorBoard's profile plugin open: a cell's,
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
from jax.profiler import ProfileData

STEP_NAME = "train"
COMPLETION_PREFIX = "end: "
"""XLA:CPU's name for the event that marks an asynchronous op's completion."""


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


def _stats(event) -> dict:
    return dict(event.stats)


def parse_steps(path: str) -> list[StepTrace]:
    """Per-step executions and busy time from one .xplane.pb file.

    An op's busy interval runs from its event's start to its completion. XLA:CPU runs some
    thunks asynchronously (large dots and parallel loop fusions go to its intra-op thread
    pool): the op's event then covers only the launch, and the work ends at a separate
    `end: <op>` event linked to it by a flow id (the op's `_p` stat is the completion's
    `_c`). Reading the op events alone would count that work as idle, host time. An op
    whose completion the profiler stopped before recording keeps its own event's end.
    """
    data = ProfileData.from_file(path)
    steps: list[tuple[int, float, float]] = []
    executions: dict[tuple, tuple[float, str]] = {}
    ops: list[tuple[float, float, tuple | None]] = []  # (start, end, completion key)
    completions: dict[tuple, list[float]] = {}  # (flow id, op name) -> completion ends;
    # an op ends at the first of its completions after its start (ids are not promised unique)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = _stats(event)
                end_ns = event.start_ns + event.duration_ns
                if event.name == STEP_NAME and "step_num" in stats:
                    steps.append((int(stats["step_num"]), event.start_ns, end_ns))
                elif "hlo_module" in stats and "run_id" in stats:
                    key = (plane.name, stats["hlo_module"], stats.get("program_id"),
                           stats["run_id"])
                    start = executions.get(key, (float("inf"), ""))[0]
                    executions[key] = (min(start, event.start_ns), stats["hlo_module"])
                    flow = (stats["_p"], event.name) if "_p" in stats else None
                    ops.append((event.start_ns, end_ns, flow))
                elif event.name.startswith(COMPLETION_PREFIX) and "_c" in stats:
                    flow = (stats["_c"], event.name.removeprefix(COMPLETION_PREFIX))
                    completions.setdefault(flow, []).append(end_ns)
    intervals = [(start, max(end, min((t for t in completions.get(flow, ()) if t >= start),
                                      default=end)))
                 for start, end, flow in ops]
    result = []
    for step, begin, end in sorted(steps):
        inside = sorted((start, module) for key, (start, module) in executions.items()
                        if begin <= start <= end)
        spans = sorted((a, min(b, end)) for a, b in intervals if begin <= a <= end)
        result.append(StepTrace(step=step, executions=len(inside),
                                modules=tuple(m for _, m in inside), wall_ns=end - begin,
                                busy_ns=_union_length(spans)))
    return result


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in spans:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total
