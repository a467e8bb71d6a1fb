"""Plans one cell in this process: the arm's step compiled for the target, then read.

Order: imports -> the target's compile-only devices (libtpu loaded) -> the arm's plan
(`Arm.plan`: an abstract build lowered for the target; nothing is materialized, and the
program is the one `parity run` times, the trainer's own) -> each
executable a step calls compiled (or its plan read back from the plan cache) -> its memory
analysis and HLO counts (`harness.xla.counts`) -> the record's `plan`. An executable with no
call per step (MaxText's accumulating kernel at GA 1) adds nothing to a step's figures and
is not compiled: at the nightly's sizes it would cost minutes of compile for nothing.

Planned peak per device = the maximum, over the executables a step runs, of that
executable's argument + output + temp - alias bytes plus the train state that stays in HBM
while it runs without being one of its arguments (`ArmPlan.held`: the optimizer moments
during a split fwd/bwd; nothing for a single-jit step). XLA's own `peak_memory_in_bytes` of
the same executable, plus the same held state, is recorded beside it.

The plan cache. A compile for a TPU topology is deterministic in what it is given: the
lowered program (its StableHLO text, which holds its shardings and donations), the compiler
options, the target and the versions of libtpu, jax and jaxlib (and XLA_FLAGS and
LIBTPU_INIT_ARGS, which change what XLA does). Keyed by those, what the planner reads of a
compiled executable (its memory analysis, optimized HLO text, and the rows of what holds
its peak read from XLA's buffer-assignment dump, harness.xla.peak) is stored once and read
back by any later plan of the same program: a nightly that plans unchanged arms, or an arm
re-planned after a change elsewhere. An entry whose rows were read by another version of
that reader is compiled again. The record says which executables came from the cache
(their compile_s is 0). JAX's own persistent cache cannot serve this: it cannot load a
compile-only executable back.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import jax

from harness.store.results import write_whole
from harness.xla import peak
from reports.record import ExecutablePlan, Plan, Record

MEMORY = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "peak_memory_in_bytes", "host_temp_size_in_bytes")
"""What the planner keeps of an executable's memory analysis."""


@dataclasses.dataclass(frozen=True)
class CompiledPlan:
    """What the planner reads of one compiled executable."""

    memory: dict[str, int]
    text: str
    """The optimized HLO text (`Compiled.as_text()`)."""
    compile_s: float
    cached: bool
    peak: list[dict] | None = None
    """Its planned total as rows of XLA's buffer assignment (harness.xla.peak.Group as
    dicts)."""
    peak_unavailable: str | None = None
    """Why `peak` is None."""
    hlo_stage_s: float | None = None
    """Of `compile_s`, the seconds until XLA wrote the buffer assignment (`hlo_stage_s`)."""


def cache_key(lowered: jax.stages.Lowered, options: dict | None, target: dict) -> str:
    """What a compile for `target` is deterministic in (see the module docstring)."""
    import jaxlib

    parts = [lowered.as_text(), json.dumps(options or {}, sort_keys=True, default=str),
             target["target"], str(target["slices"]), str(target["libtpu"]),
             str(target.get("libtpu_build")), jax.__version__,
             jaxlib.__version__, os.environ.get("XLA_FLAGS", ""),
             os.environ.get("LIBTPU_INIT_ARGS", "")]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def compile_for_plan(lowered: jax.stages.Lowered, options: dict | None, target: dict,
                     cache: Path | None) -> CompiledPlan:
    """Compiles `lowered` for the target, or reads its plan back from `cache`."""
    from harness.xla.target import compile_plan

    path = cache / f"{cache_key(lowered, options, target)}.json.gz" if cache else None
    if path is not None and path.exists():
        stored = json.loads(gzip.decompress(path.read_bytes()))
        if stored.get("peak_version") == peak.VERSION:  # else compiled again, read anew
            return CompiledPlan(memory=stored["memory"], text=stored["text"], compile_s=0.0,
                                cached=True, peak=stored["peak"],
                                peak_unavailable=stored.get("peak_unavailable"))
    with tempfile.TemporaryDirectory(prefix="parity-dump-") as dump:
        began, start = time.time(), time.perf_counter()
        compiled = compile_plan(lowered, {**(options or {}), **peak.dump_options(dump)})
        seconds = time.perf_counter() - start
        analysis = compiled.memory_analysis()
        text = compiled.as_text()
        memory = {k: int(getattr(analysis, k)) for k in MEMORY}
        held, why = _peak_holders(dump, text, memory)
        hlo_s = hlo_stage_s(dump, began, seconds)
    found = CompiledPlan(memory=memory, text=text, compile_s=seconds, cached=False,
                         peak=held, peak_unavailable=why, hlo_stage_s=hlo_s)
    if path is not None:  # whole, by rename: a concurrent reader sees it or nothing
        write_whole(path, gzip.compress(json.dumps(
            {"memory": found.memory, "text": found.text, "peak": found.peak,
             "peak_unavailable": found.peak_unavailable, "peak_version": peak.VERSION}
        ).encode(), compresslevel=3))
    return found


def hlo_stage_s(dump: str, began: float, seconds: float) -> float | None:
    """Seconds from `began` (wall clock) until XLA wrote the buffer-assignment dump under
    `dump`: its HLO passes and buffer assignment, where every figure of a plan is fixed (the
    optimized module, its memory analysis, what holds its peak). The rest of a compile's
    `seconds` is code generation for the target (instruction scheduling, register
    allocation, SparseCore code), which no figure reads but which is what fails when the
    compiler cannot build the program. None without that dump."""
    try:
        written = peak.dumped(dump, peak.ASSIGNMENT_SUFFIX).stat().st_mtime
    except (peak.Unavailable, OSError):
        return None
    return min(max(written - began, 0.0), seconds)


def _peak_holders(dump: str, text: str,
                  memory: dict[str, int]) -> tuple[list[dict] | None, str | None]:
    """(the planned total's rows, None) from XLA's dump under `dump` (harness.xla.peak),
    or (None, why)."""
    try:
        return [dataclasses.asdict(g) for g in peak.from_dump(dump, text, memory)], None
    except (peak.Unavailable, OSError) as err:
        return None, str(err)


def executable_plan(compiled: CompiledPlan, calls: int, held_bytes: int) -> ExecutablePlan:
    """One executable's memory analysis and HLO counts (one call, per device)."""
    from harness.xla import counts

    memory = compiled.memory
    try:
        counted, why = counts.costs(compiled.text), None
    except counts.Unavailable as err:
        counted, why = None, str(err)
    return ExecutablePlan(
        calls_per_step=calls, argument=memory["argument_size_in_bytes"],
        output=memory["output_size_in_bytes"], alias=memory["alias_size_in_bytes"],
        temp=memory["temp_size_in_bytes"], peak_memory_in_bytes=memory["peak_memory_in_bytes"],
        host_temp=memory["host_temp_size_in_bytes"], held_bytes=held_bytes,
        hbm_bytes=counted and counted.hbm_bytes, flops=counted and counted.flops,
        collective_bytes=counted and dict(counted.collective_bytes),
        trip_counts=counted.trip_counts if counted else [], unavailable=why,
        compile_s=compiled.compile_s, hlo_stage_s=compiled.hlo_stage_s, cached=compiled.cached,
        peak_buffers=compiled.peak or [], peak_unavailable=compiled.peak_unavailable)


def _per_step(executables: dict[str, ExecutablePlan], read) -> float | None:
    values = [(e.calls_per_step, read(e)) for e in executables.values() if e.calls_per_step]
    if any(v is None for _, v in values):
        return None
    return sum(calls * v for calls, v in values)


def summarize(arm_plan, compiled: dict[str, CompiledPlan], *, target: dict,
              mesh: dict[str, int], model_flops: float) -> Plan:
    """The record's plan section from an arm's plan, its compiled executables and the
    target's description."""
    from arms.abstract import bytes_held, bytes_per_device
    from harness.xla import categories

    resident = {part: bytes_per_device(tree) for part, tree in arm_plan.state.items()}
    held = bytes_held(arm_plan.held, resident)
    executables = {
        name: executable_plan(compiled[name], arm_plan.calls_per_step.get(name, 0),
                              held.get(name, 0))
        for name in compiled}
    running = {n: e for n, e in executables.items() if e.calls_per_step}
    planned = {n: e.argument + e.output + e.temp - e.alias + e.held_bytes
               for n, e in running.items()}
    peak_name = max(planned, key=planned.get)
    kinds = next(iter(running.values())).collective_bytes or {}
    collectives = {kind: _per_step(running, lambda e, k=kind: e.collective_bytes
                                   and e.collective_bytes[k]) for kind in kinds}
    capacity = target.get("hbm_capacity_bytes")
    return Plan(
        target=target["target"], slices=target["slices"], device_kind=target["device_kind"],
        device_count=target["device_count"], libtpu=target["libtpu"], mesh=mesh,
        hbm_capacity_bytes=capacity, executables=executables, resident_bytes=resident,
        planned_peak_bytes=planned[peak_name], peak_executable=peak_name,
        xla_peak_bytes=max(e.peak_memory_in_bytes + e.held_bytes for e in running.values()),
        hbm_bytes_per_step=_per_step(running, lambda e: e.hbm_bytes),
        flops_per_step=_per_step(running, lambda e: e.flops),
        model_flops_per_step=model_flops,
        collective_bytes_per_step=(None if any(v is None for v in collectives.values())
                                   else collectives),
        fits=None if capacity is None else planned[peak_name] <= capacity,
        compile_s=sum(c.compile_s for c in compiled.values()),
        categories_per_step=categories.per_step({n: c.text for n, c in compiled.items()},
                                                arm_plan.calls_per_step),
        host_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def plan_cell(run, phases) -> Record:
    """The plan record of cell `run` (a `harness.contract.CellRun` with `plan_target`)."""
    from arms.registry import lookup
    from arms.spec import CellSpec
    from harness.measure.flops import model_flops_per_step
    from harness.measure.roofline import roofline
    from harness.xla import target

    spec = CellSpec.from_dict(run.spec)
    choice = lookup(run.arm)
    choice.preload()
    phases.end("imports")
    devices = target.topology_devices(run.plan_target, run.plan_slices)
    described = target.describe(run.plan_target, run.plan_slices)
    phases.end("backend")
    arm = choice.make(spec, devices=devices)
    mesh = {name: int(size) for name, size in arm.mesh.shape.items()}  # the cell's axes
    arm_plan = arm.plan()
    phases.end("build")
    cache = Path(run.plan_cache) if run.plan_cache else None
    compiled = {name: compile_for_plan(lowered, arm_plan.compiler_options, described, cache)
                for name, lowered in arm_plan.executables.items()
                if arm_plan.calls_per_step.get(name, 0)}
    phases.end("compile")
    if run.plan_hlo_dir:
        directory = Path(run.plan_hlo_dir)
        directory.mkdir(parents=True, exist_ok=True)
        for name, found in compiled.items():
            (directory / f"{name}.hlo.txt").write_text(found.text)
    plan = summarize(arm_plan, compiled, target=described, mesh=mesh,
                     model_flops=model_flops_per_step(spec.model_config(), batch=spec.batch,
                                                      seq=spec.seq))
    plan.hlo_dir = run.plan_hlo_dir
    plan.libtpu_build = described.get("libtpu_build")
    plan.roofline = roofline(plan, spec.dtype)
    phases.end("cost")
    return Record(about=arm.about(), plan=plan)
