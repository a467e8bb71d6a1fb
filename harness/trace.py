"""xplane capture and parse: executions per step, device-busy time and host time per step.

Executions are counted from XLA's own events: every thunk/op event carries `hlo_module`,
`program_id` and `run_id` stats, and one (module, program, run) triple is one execution of
one executable. Steps are the `StepTraceAnnotation` events on the host's python line.

Layouts: on CPU there is no device plane; executions appear on host threads
(`/host:CPU`, lines such as `tf_XLAPjRtCpuClient/...` or the dispatching `python` line).
On accelerators xprof's schema puts ops on `/device:GPU:N` or `/device:TPU:N` planes (lines
"XLA Ops" / "XLA Modules"); that layout is read by the same code but awaits a run on
hardware to be confirmed.
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
    """Union of the executions' op intervals (device-busy time; on CPU, compute threads)."""


def profiler_options() -> jax.profiler.ProfileOptions:
    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # no Python call tracing: small, cheap traces
    options.enable_hlo_proto = False
    return options


@contextlib.contextmanager
def capture(logdir: str | None = None) -> Iterator[str]:
    """Traces into a fresh directory (two captures in one second would otherwise collide)."""
    parent = logdir or tempfile.gettempdir()
    os.makedirs(parent, exist_ok=True)
    directory = tempfile.mkdtemp(prefix="trace-", dir=parent)
    with jax.profiler.trace(directory, profiler_options=profiler_options()):
        yield directory


def find_xplane(directory: str) -> str:
    found = sorted(glob.glob(os.path.join(directory, "**", "*.xplane.pb"), recursive=True))
    if not found:
        raise FileNotFoundError(f"no .xplane.pb under {directory}")
    return found[-1]


def _stats(event) -> dict:
    return dict(event.stats)


def parse_steps(path: str) -> list[StepTrace]:
    """Per-step executions and busy time from one .xplane.pb file."""
    data = ProfileData.from_file(path)
    steps: list[tuple[int, float, float]] = []
    executions: dict[tuple, tuple[float, str]] = {}
    intervals: list[tuple[float, float, tuple]] = []
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = _stats(event)
                if event.name == STEP_NAME and "step_num" in stats:
                    steps.append((int(stats["step_num"]), event.start_ns,
                                  event.start_ns + event.duration_ns))
                elif "hlo_module" in stats and "run_id" in stats:
                    key = (plane.name, stats["hlo_module"], stats.get("program_id"),
                           stats["run_id"])
                    start = executions.get(key, (float("inf"), ""))[0]
                    executions[key] = (min(start, event.start_ns), stats["hlo_module"])
                    intervals.append((event.start_ns, event.start_ns + event.duration_ns, key))
    result = []
    for step, begin, end in sorted(steps):
        inside = sorted((start, module) for key, (start, module) in executions.items()
                        if begin <= start <= end)
        spans = sorted((a, b) for a, b, _ in intervals if begin <= a <= end)
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
