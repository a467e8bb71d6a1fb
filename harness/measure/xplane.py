"""Reading one xplane capture: the ops each device ran, the executions they belong to, and
the step windows, from what real captures contain.

Three layouts, read by what their events carry (never by a stat a capture lacks):
- **XLA:CPU**: no device plane; ops are events on `/host:CPU` lines carrying `hlo_module`,
  `program_id` and `run_id`, and one (module, program, run) is one execution. XLA:CPU runs
  some ops asynchronously: the op's event covers the launch, and the work ends at an
  `end: <op>` event linked to it by a flow id (the op's `_p` stat is the completion's `_c`).
- **Device planes with an "XLA Modules" line** (TPU): each module event is one execution, the
  "XLA Ops" line its ops.
- **Device planes of kernels** (GPU, as CUPTI/ROCTracer record them: stream lines of
  `/device:GPU:N`, no run_id, no module line): every event with a `correlation_id` is an op;
  it is a memory copy where it or its host launch says so (`memcpy_details`, a name with
  "memcpy"), else a kernel; either may be an executable's (it names its `hlo_module`), or a
  transfer of the host's (it names none). The host launch with the same correlation id falls
  inside the
  host's dispatch of one executable (`PJRT_LoadedExecutable_Execute`, ...): one (device,
  hlo_module, program_id, dispatch) is one execution. Where the host shows no dispatch, a run
  of consecutive kernels of one module on a device is one.

Planes are keyed by name (several real planes share an id); a plane with no op is idle and
left out. Step windows are the `StepTraceAnnotation` events (`step_num`); a capture without
them is one window.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter

from jax.profiler import ProfileData

from harness.contract import STEP_ANNOTATION
from harness.xla import categories, hlo

COMPLETION_PREFIX = "end: "
"""XLA:CPU's name for the event that marks an asynchronous op's completion."""
HOST = "/host:CPU"
DISPATCHES = ("PJRT_LoadedExecutable_Execute", "PjRtStreamExecutorLoadedExecutable::Execute",
              "PjRtCApiLoadedExecutable::Execute")
"""Host events that are one dispatch of one executable (any device's launches inside)."""


@dataclasses.dataclass(frozen=True)
class Op:
    device: str
    """Plane name ("/host:CPU" for XLA:CPU's ops)."""
    name: str
    """The HLO op where the event names it (`hlo_op`), else the event's own name."""
    start: float
    end: float
    """When it completed (ns)."""
    memcpy: bool
    execution: tuple | None
    """The execution it belongs to (None: a transfer outside any executable)."""
    module: str | None
    text: str | None = None
    """The op's whole HLO instruction, where the trace names it so (TPU); `name` is then
    the instruction's name."""
    category: str | None = None
    """harness.xla.categories' category of the instruction (from its name where the trace
    gives only that)."""
    shape: str | None = None
    """The op's result shape, short (harness.xla.hlo.short_shape), where the trace gives it."""
    encloses: bool = False
    """A control-flow op (while, conditional, call) whose interval holds the ops of its
    body, each traced on its own: its time is theirs."""


@dataclasses.dataclass(frozen=True)
class Capture:
    ops: list[Op]
    executions: dict[tuple, tuple[float, str]]
    """Execution key -> (its start, its module)."""
    steps: list[tuple[int, float, float]]
    """(step number, begin, end) of each step annotation, in order."""


def _stats(event) -> dict:
    return dict(event.stats)


def read(path: str) -> Capture:
    data = ProfileData.from_file(path)
    planes = {plane.name: plane for plane in data.planes}  # by name: ids repeat
    steps, ops, executions = [], [], {}
    launches: dict[str, list] = {}  # correlation id -> [(start, memcpy)]
    dispatches: list[tuple[float, float]] = []
    cpu_ops, completions = [], {}
    for name, plane in planes.items():
        if name.startswith("/device:"):
            continue
        for line in plane.lines:
            for event in line.events:
                stats = _stats(event)
                end = event.start_ns + event.duration_ns
                if event.name == STEP_ANNOTATION and "step_num" in stats:
                    steps.append((int(stats["step_num"]), event.start_ns, end))
                elif "hlo_module" in stats and "run_id" in stats:  # XLA:CPU's own ops
                    cpu_ops.append((event, stats, end))
                elif event.name.startswith(COMPLETION_PREFIX) and "_c" in stats:
                    flow = (stats["_c"], event.name.removeprefix(COMPLETION_PREFIX))
                    completions.setdefault(flow, []).append(end)
                if "correlation_id" in stats:  # a host launch of a device op
                    launches.setdefault(str(stats["correlation_id"]), []).append(
                        (event.start_ns, _is_memcpy(event.name, stats)))
                if event.name in DISPATCHES:
                    dispatches.append((event.start_ns, end))
    for event, stats, end in cpu_ops:
        key = (HOST, stats["hlo_module"], stats.get("program_id"), stats["run_id"])
        flow = (stats["_p"], event.name) if "_p" in stats else None
        # an op ends at the first of its completions after its start (ids are not unique)
        done = min((t for t in completions.get(flow, ()) if t >= event.start_ns), default=end)
        ops.append(Op(HOST, str(stats.get("hlo_op", event.name)), event.start_ns,
                      max(end, done), False, key, stats["hlo_module"]))
        start = executions.get(key, (float("inf"), ""))[0]
        executions[key] = (min(start, event.start_ns), stats["hlo_module"])
    dispatches.sort()
    for name, plane in planes.items():
        if name.startswith("/device:"):
            lines = {line.name: line for line in plane.lines}
            if "XLA Modules" in lines:
                _read_modules(name, lines, ops, executions)
            else:
                _read_kernels(name, plane, launches, dispatches, ops, executions)
    return Capture(ops=ops, executions=executions, steps=sorted(steps))


def _is_memcpy(name: str, stats: dict) -> bool:
    return "memcpy_details" in stats or "memcpy" in name.lower()


def _read_modules(device: str, lines: dict, ops: list, executions: dict) -> None:
    """A device plane with XLA's own module and op lines (TPU)."""
    modules = sorted((e.start_ns, e.start_ns + e.duration_ns, e.name)
                     for e in lines["XLA Modules"].events)
    starts = [m[0] for m in modules]
    for start, _, module in modules:
        executions[(device, module, start)] = (start, module)
    for event in lines["XLA Ops"].events if "XLA Ops" in lines else ():
        index = bisect.bisect_right(starts, event.start_ns) - 1
        owner = modules[index] if index >= 0 and event.start_ns <= modules[index][1] else None
        found = hlo.instruction(event.name)  # TPU names each op by its whole instruction
        described = {} if found is None else {
            "text": event.name, "category": _category(found),
            "shape": hlo.short_shape(found.shape), "encloses": found.opcode in ENCLOSING}
        ops.append(Op(device, found.name if found else event.name, event.start_ns,
                      event.start_ns + event.duration_ns,
                      _is_memcpy(event.name, _stats(event)),
                      (device, owner[2], owner[0]) if owner else None,
                      owner[2] if owner else None, **described))


def _read_kernels(device: str, plane, launches: dict, dispatches: list, ops: list,
                  executions: dict) -> None:
    """A device plane of kernel and copy events (GPU): see the module docstring."""
    starts = [d[0] for d in dispatches]
    found = []
    for line in plane.lines:
        for event in line.events:
            stats = _stats(event)
            if "correlation_id" not in stats:
                continue
            host = [t for t, _ in launches.get(str(stats["correlation_id"]), ())
                    if t <= event.start_ns]
            launched = max(host, default=None)
            memcpy = _is_memcpy(event.name, stats) or any(
                m for t, m in launches.get(str(stats["correlation_id"]), ()) if t == launched)
            found.append((event, stats, launched, memcpy))
    found.sort(key=lambda f: f[0].start_ns)
    previous = None  # the fallback's run of one module
    for event, stats, launched, memcpy in found:
        module = stats.get("hlo_module")
        key = None
        if module is not None:  # an executable's op, a kernel or a copy (XLA's copy.1)
            dispatch = None
            if launched is not None:
                index = bisect.bisect_right(starts, launched) - 1
                while index >= 0 and dispatches[index][1] < launched:
                    index -= 1  # inner dispatches end first; an enclosing one may be earlier
                dispatch = dispatches[index][0] if index >= 0 else None
            if dispatch is not None:
                key = (device, module, stats.get("program_id"), dispatch)
            else:
                same = previous and previous[1:3] == (module, stats.get("program_id"))
                key = previous if same else (device, module, stats.get("program_id"),
                                             ("run", event.start_ns))
            previous = key
            start = executions.get(key, (float("inf"), ""))[0]
            executions[key] = (min(start, event.start_ns), module)
        ops.append(Op(device, str(stats.get("hlo_op", event.name)), event.start_ns,
                      event.start_ns + event.duration_ns, memcpy, key, module))


def union_ns(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals."""
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(spans):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


def _category(found: hlo.Instruction) -> str:
    """An instruction's category without its module: a fusion named for the matmul it
    holds ("convolution_bitcast_fusion.8") is a matmul, else its kind decides."""
    by_name = categories.category_of_name(found.name)
    return by_name if by_name == categories.MATMUL else categories.category(found)


ENCLOSING = {"while", "conditional", "call"}
"""Control flow whose traced interval holds its body's ops (traced each on its own)."""

BREAKDOWN = ("compute", "collectives", "copies", "idle")
"""A device's time, each instant given to the first of these that an op of it covers."""


def kind(op: Op) -> str:
    """compute, collectives or copies: the op's category (harness.xla.categories, from its
    HLO op name) folded to what the breakdown tells apart; a memory copy or host transfer is
    a copy, a collective a collective, any other op (a GPU kernel without an HLO name
    included) compute."""
    if op.memcpy:
        return "copies"
    found = op.category or categories.category_of_name(op.name)
    if found.startswith("collective: "):
        return "collectives"
    return "copies" if found in (categories.COPY, categories.HOST) else "compute"


def breakdown_ns(ops: list[Op], begin: float, end: float) -> dict[str, float]:
    """The window [begin, end) split into compute, collectives, copies and idle: each
    instant goes to the first kind (in that order) with an op running then, or to idle when
    none runs, so a collective hidden behind compute counts as compute (only its exposed
    time is the collectives'), and the four add up to the window exactly."""
    edges = []
    for op in ops:
        start, stop = max(op.start, begin), min(op.end, end)
        if stop > start:
            what = kind(op)
            edges += [(start, 1, what), (stop, -1, what)]
    edges.sort(key=lambda e: (e[0], e[1]))
    found = dict.fromkeys(BREAKDOWN, 0.0)
    running = dict.fromkeys(BREAKDOWN[:3], 0)
    at = begin
    for time, step, what in edges:
        busy = next((k for k in BREAKDOWN[:3] if running[k]), "idle")
        found[busy] += time - at
        running[what] += step
        at = time
    found["idle"] += end - at
    return found


def devices(capture: Capture, top: int = 10) -> list[dict]:
    """Per device with ops: busy ms (the union of its kernels' intervals), memcpy ms (of its
    copies'), span ms (first op's start to last op's end), executions and executions per
    module, the span's breakdown into compute, collectives, copies and idle ms
    (`breakdown_ns`), and its `top` ops per step (`top_ops`)."""
    found = []
    steps = max(len(capture.steps), 1)
    for device in dict.fromkeys(op.device for op in capture.ops):
        mine = [op for op in capture.ops if op.device == device]
        kernels = [op for op in mine if not op.memcpy]
        begin, end = min(op.start for op in mine), max(op.end for op in mine)
        keys = {op.execution for op in mine if op.execution is not None}
        ranked = [op for op in kernels if not op.encloses]
        found.append({
            "name": device,
            "busy_ms": union_ns([(op.start, op.end) for op in kernels]) / 1e6,
            "memcpy_ms": union_ns([(op.start, op.end) for op in mine if op.memcpy]) / 1e6,
            "span_ms": (end - begin) / 1e6,
            "breakdown_ms": {k: v / 1e6 for k, v in breakdown_ns(mine, begin, end).items()},
            "executions": len(keys),
            "modules": dict(Counter(capture.executions[k][1] for k in keys)),
            "steps": steps,
            "ranked_ms": sum(op.end - op.start for op in ranked) / 1e6,
            "top_ops": top_ops(ranked, steps, top),
        })
    return found


def top_ops(ops: list[Op], steps: int, top: int) -> list[dict]:
    """The `top` ops by their summed time, per step (a capture's `steps` windows; 1 where it
    has no step annotations): name, category, result shape, ms and runs per step, and the
    whole instruction where the trace gives it. Control flow that encloses its body's ops
    is left to the caller to leave out (`Op.encloses`)."""
    by_name: dict[str, list[Op]] = {}
    for op in ops:
        by_name.setdefault(op.name, []).append(op)
    rows = [{"name": name, "category": same[0].category or categories.category_of_name(name),
             "shape": same[0].shape, "ms_per_step": sum(o.end - o.start for o in same) / 1e6
             / steps, "runs_per_step": len(same) / steps, "text": same[0].text}
            for name, same in by_name.items()]
    return sorted(rows, key=lambda r: -r["ms_per_step"])[:top]
