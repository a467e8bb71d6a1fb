"""Runs one cell in this (fresh) process and writes its record: `python -m harness.worker`.

Order inside the cell: build + compile (timed apart) -> the first warmup step, whose captured
gradient is kept for the parity check -> the other warmup steps -> the executables' planned
memory, and on the CPU backend the host heap they will reuse faulted in (measure.reserve_heap)
-> the untraced timed window (after a full garbage collection: per-step wall, dispatch and
wait; GC pauses; RSS high-water) -> compiled cost of the executables -> an optional traced window
(never the timed one) -> the exact reference gradient, computed last so its memory cannot
pollute the measured peaks. Each phase is a small function returning its section of the
`reports.record.Record` the cell writes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback

from reports.record import (
    Cost,
    Environment,
    ExecutableMemory,
    Failure,
    GCPauses,
    HostMemory,
    Memory,
    Parity,
    Record,
    Timing,
    Trace,
    section,
)

STEP_ANNOTATION = "train"
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "MemoryError")
"""What XLA (any backend) and Python say when an allocation fails."""
PEER_MARKERS = ("stopped sending heartbeats", "Gloo context initialization failed",
                "Connection closed by peer", "Connection reset by peer")
"""What one process of a multi-process cell sees when another has gone: the coordination
service's heartbeat check aborting it, or gloo failing to reach the peer at its first
collective (context setup) or mid-transfer."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRun:
    """One cell as the runner hands it to a worker."""

    arm: str
    """Arm name (arms.registry.resolve)."""
    spec: dict
    """arms.spec.CellSpec as a dict."""
    steps: int = 10
    """Timed steps."""
    warmup: int = 3
    """Untimed steps before timing (>= 1: the first one is the parity step)."""
    trace: bool = False
    """Capture and parse a separate traced window after timing."""
    trace_steps: int = 3
    """Steps in the traced window."""
    trace_dir: str | None = None
    """Root directory of the traces (None: the temp dir); the capture goes to a directory of
    its own below it (`trace_session`)."""
    trace_session: str | None = None
    """Path of this cell's capture below `trace_dir`, set by the runner:
    '<run id>/<arm>-<preset>-s<seq>-b<batch>-ga<ga>' (with `-2`, `-3`, ... appended where it
    exists); None: a fresh random `trace-*` directory."""
    trace_hlo: bool = False
    """Capture the traced window with each module's HLO proto, which xprof's memory_viewer
    and graph_viewer need (~1.5x bigger trace files)."""
    parity: bool = True
    """Compare the first step's captured gradient with the exact reference."""
    plugins: tuple[str, ...] = ()
    """Modules to import first (they may register extra arms, e.g. test-only ones)."""
    distributed: dict | None = None
    """jax.distributed settings: {"coordinator", "num_processes", "process_id"} (or
    {"auto": True} where JAX detects the cluster, e.g. Cloud TPU); None = one process."""
    heartbeat_s: int = 30
    """jax.distributed heartbeat timeout: how long a dead peer goes unnoticed."""
    plan_target: str | None = None
    """Plan the cell for this TPU topology instead of running it (harness.plan.cell)."""
    plan_slices: int = 1
    """Slices of `plan_target`."""
    plan_libtpu: str | None = None
    """The libtpu version the runner's probe found (recorded with the plan)."""
    plan_hlo_dir: str | None = None
    """Where a plan writes each executable's optimized HLO text (`<executable>.hlo.txt`)."""
    plan_cache: str | None = None
    """The plan cache directory (harness.plan.cell); None: every executable is compiled."""


SPAWNED_AT = "PARITY_SPAWNED_AT"
"""Environment variable: time.time() when the runner started the cell's process, from which
the `start` phase (interpreter start-up until the worker's first line) is measured. A variable
rather than a CellRun field, so a worker of an older commit (an A/B side) ignores it."""


class Phases:
    """Wall seconds of each phase of the cell's process, in the order they ran (the record's
    `phases`): where a cell's time goes, so waste can be found by measuring."""

    def __init__(self, spawned_at: float | None = None):
        self.seconds: dict[str, float] = {}
        if spawned_at is not None:
            self.seconds["start"] = max(0.0, time.time() - spawned_at)
        self._last = time.perf_counter()

    def end(self, name: str, *, less: dict[str, float] | None = None) -> None:
        """Ends phase `name` now (its time since the previous phase ended); the seconds in
        `less` are phases measured inside it, recorded under their own names instead."""
        now = time.perf_counter()
        spent = now - self._last
        for inner, seconds in (less or {}).items():
            self.seconds[inner] = self.seconds.get(inner, 0.0) + seconds
            spent -= seconds
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, spent)
        self._last = now


def init_distributed(run: CellRun) -> None:
    """Joins the cell's processes before the backend starts (CPU: gloo collectives)."""
    import os

    import jax

    if not run.distributed:
        return
    if os.environ.get("JAX_PLATFORMS", "").startswith("cpu"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if run.distributed.get("auto"):
        jax.distributed.initialize(heartbeat_timeout_seconds=run.heartbeat_s)
        return
    jax.distributed.initialize(run.distributed["coordinator"],
                               num_processes=run.distributed["num_processes"],
                               process_id=run.distributed["process_id"],
                               initialization_timeout=120,
                               heartbeat_timeout_seconds=run.heartbeat_s)


def host_gather(tree):
    """Every process's copy of `tree` gathered to host numpy (one process: device_get)."""
    import jax

    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return jax.tree.map(lambda x: multihost_utils.process_allgather(x, tiled=True), tree)


COMPILE_CACHE = "PARITY_COMPILE_CACHE"
"""Environment variable: the directory of the JAX persistent compilation cache this cell
shares with the other cells of its arm (harness.runner.cell_store gives each arm one);
unset: no cache, every compile is cold."""


def use_compile_cache() -> None:
    """Points JAX's persistent compilation cache at $PARITY_COMPILE_CACHE (every program,
    however quick to compile), where one is given. A program
    loaded from it is the executable a cold compile would build (same cost and memory
    analysis); only the compile seconds differ, and the record counts the hits."""
    import os

    path = os.environ.get(COMPILE_CACHE)
    if not path:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileCounter:
    """Counts backend compiles (cold, or loaded from the persistent compilation cache: JAX
    reports both as a backend compile) and, of those, the cache hits, through jax.monitoring
    listeners."""

    def __init__(self):
        import jax

        self.count = 0
        self.cache_hits = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def _on_event(self, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1


def start_backend(phases: Phases) -> CompileCounter:
    """Starts JAX's backend with the run's compilation cache; from here compiles are
    counted (the returned counter)."""
    import jax

    use_compile_cache()
    jax.devices()
    compiles = CompileCounter()
    phases.end("backend")
    return compiles


def _block(out) -> None:
    import jax

    jax.block_until_ready(out)


def run_cell(run: CellRun, phases: Phases | None = None) -> Record:
    """Measures one cell in this process: a script of phases, each filling its section and
    ending its entry in `phases`."""
    import importlib

    phases = phases or Phases()
    for module in run.plugins:
        importlib.import_module(module)
    if run.plan_target:
        from harness.plan.cell import plan_cell

        return plan_cell(run, phases)
    from arms.registry import preload
    from arms.spec import CellSpec

    if run.warmup < 1:
        raise ValueError("warmup must be >= 1 (the first warmup step is the parity step)")
    spec = CellSpec.from_dict(run.spec)
    preload(run.arm)
    phases.end("imports")
    compiles = start_backend(phases)
    arm, build_s = _build(run.arm, spec)
    phases.end("build", less={"compile": arm.compile_seconds})
    batches = arm.place(spec.micro_batches(0))
    first_loss, captured = _warmup(arm, batches, run)
    phases.end("warmup")
    executables = arm.executables()
    planned = _planned_memory(executables)
    reserved = _reserve_heap(planned)
    phases.end("memory")
    timing, rss_growth = _timed_window(arm, batches, run, spec, compiles, build_s)
    phases.end("timed")
    cost = _cost(executables, arm.calls_per_step(), timing.stats.median_ms, spec)
    phases.end("cost")
    traced = parity = None
    if run.trace:
        traced = _traced_window(arm, batches, run)
        phases.end("trace")
    if run.parity:
        parity = _parity(spec, captured, first_loss)
        phases.end("reference")
    arm.close()
    return Record(about=arm.about(), timing=timing,
                  memory=_memory(planned, rss_growth, reserved), cost=cost, trace=traced,
                  parity=parity)


def _build(name: str, spec):
    """(built arm, build seconds): model, trainer and every executable a step runs."""
    from arms.registry import make_arm

    arm = make_arm(name, spec)
    start = time.perf_counter()
    arm.build()
    return arm, time.perf_counter() - start


def _warmup(arm, batches, run: CellRun):
    """Runs the warmup steps; returns the first one's (loss, captured gradient on the host)."""
    _block(arm.step(batches))  # warmup 1: the parity step
    first_loss = arm.last_loss()
    if not math.isfinite(first_loss):
        raise FloatingPointError(f"non-finite loss {first_loss} at step 1 of arm {run.arm}; "
                                 "check the learning rate, dtype and data of this cell")
    captured = host_gather(arm.captured_gradient()) if run.parity else None
    for _ in range(run.warmup - 1):
        _block(arm.step(batches))
    return first_loss, captured


def _timed_window(arm, batches, run: CellRun, spec, compiles,
                  build_s: float) -> tuple[Timing, int | None]:
    """The untraced timed window: per-step wall, dispatch and wait; GC pauses; recompiles.
    Also returns the process's RSS high-water growth over the window (for Memory)."""
    from harness import measure

    compiled_before = compiles.count
    measure.settle_heap()
    gc_pauses = measure.GCPauses()
    with measure.machine_noise() as noise, gc_pauses.watch(), \
            measure.rss_high_water() as rss:
        step_ms, dispatch_ms, wait_ms = measure.timed_steps(lambda: arm.step(batches),
                                                            run.steps, _block)
    timing = timing_record(arm, run, spec, (step_ms, dispatch_ms, wait_ms), gc_pauses,
                           compiles.count - compiled_before, compiles, build_s, noise)
    return timing, rss["rss_delta_bytes"]


def timing_record(arm, run: CellRun, spec, samples: tuple[list, list, list], gc_pauses,
                  recompiles: int, compiles: CompileCounter, build_s: float, noise: dict,
                  slices: list[int] | None = None) -> Timing:
    """The record's Timing from a timed window's (wall, dispatch, wait) ms per step, its GC
    pauses, compiles after warmup, the machine-noise reading and, for in-process pairing,
    the slices the steps ran in."""
    from harness import measure

    step_ms, dispatch_ms, wait_ms = samples
    stats = measure.step_stats(step_ms)
    tokens = spec.batch * spec.seq
    return Timing(
        steps=run.steps, warmup=run.warmup, step_ms=step_ms, dispatch_ms=dispatch_ms,
        wait_ms=wait_ms, stats=stats,
        gc=GCPauses(count=gc_pauses.count, total_ms=gc_pauses.total_ms),
        tokens_per_step=tokens, tokens_per_s=tokens / (stats.median_ms / 1e3),
        build_s=build_s, compile_s=arm.compile_seconds, recompiles_after_warmup=recompiles,
        executions_per_step=arm.executions_per_step(),
        compiles=compiles.count, compile_cache_hits=compiles.cache_hits,
        probe_ms=noise["probe_ms"], steal=noise["steal"], other_load=noise["other_load"],
        slices=slices)


def _planned_memory(executables) -> dict[str, ExecutableMemory | None]:
    from harness import measure

    return {name: measure.executable_memory(c) for name, c in executables.items()}


def _reserve_heap(planned: dict[str, ExecutableMemory | None]) -> int:
    """On the CPU backend, faults in host heap for the executions of the timed window before
    it starts: a multiple of the largest execution's fresh bytes (temp, and outputs not
    written in place); see harness.measure.reserve_heap. An accelerator's plan is device
    memory, which its runtime pools itself."""
    import jax

    from harness import measure

    if jax.default_backend() != "cpu":
        return 0
    fresh = max((m.temp + m.output - m.alias for m in planned.values() if m), default=0)
    return measure.reserve_heap(measure.RESERVE_PER_EXECUTION * fresh)


def _memory(planned, rss: int | None, reserved: int) -> Memory:
    """Each executable's planned memory, the device peak and the timed window's RSS growth,
    per host."""
    import jax
    import numpy as np

    from harness import measure

    per_device, why = measure.device_peaks(jax.local_devices())
    peak = max((p for p in per_device if p is not None), default=None)
    return Memory(peak_bytes_in_use=peak, peak_bytes_per_device=per_device,
                  peak_unavailable=why, executables=planned,
                  planned_bytes=max((m.total for m in planned.values() if m), default=None),
                  rss_delta_bytes=rss, hosts=_per_host_memory(rss, peak, np),
                  heap_reserved_bytes=reserved)


def _cost(executables, calls: dict[str, int], median_ms: float, spec) -> Cost:
    import jax

    from harness import measure
    from harness.flops import model_flops_per_step

    return measure.cost(
        executables, calls,
        model_flops=model_flops_per_step(spec.model_config(), batch=spec.batch, seq=spec.seq),
        median_ms=median_ms, device_kind=jax.local_devices()[0].device_kind,
        device_count=jax.device_count())


def _per_host_memory(rss_delta, peak, np) -> list[HostMemory]:
    """[{process, rss_delta_bytes, peak_bytes_in_use}] for every process of the cell."""
    import jax

    # KiB in int32: process_allgather goes through jax arrays (int64 needs x64 mode).
    mine = np.array([[jax.process_index(), -1 if rss_delta is None else rss_delta // 1024,
                      -1 if peak is None else peak // 1024]], np.int32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        mine = np.asarray(multihost_utils.process_allgather(mine, tiled=True))
    return [HostMemory(process=int(p), rss_delta_bytes=None if r < 0 else int(r) * 1024,
                       peak_bytes_in_use=None if k < 0 else int(k) * 1024)
            for p, r, k in mine]


def _traced_window(arm, batches, run: CellRun) -> Trace:
    import jax

    from harness import trace

    with trace.capture(run.trace_dir, session=run.trace_session,
                       hlo=run.trace_hlo) as directory:
        for i in range(run.trace_steps):
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                _block(arm.step(batches))
    path = trace.find_xplane(directory)
    steps = trace.parse_steps(path)
    return Trace(xplane=path, logdir=directory,
                 executions_per_step=[s.executions for s in steps],
                 modules_per_step=[list(s.modules) for s in steps],
                 step_ms=[s.wall_ns / 1e6 for s in steps],
                 busy_ms=[s.busy_ns / 1e6 for s in steps],
                 host_ms=[(s.wall_ns - s.busy_ns) / 1e6 for s in steps])


def _parity(spec, captured, first_loss: float) -> Parity:
    """The first step's captured gradient vs the exact sum/sum reference (computed last, so
    its memory never pollutes the measured peaks)."""
    from arms.workload import data_digest, denominators, global_norm, rel_l2

    batches = spec.micro_batches(0)
    exact_loss, exact, shared = _exact_reference(spec, batches)
    return Parity(
        data_digest=data_digest(batches), denominators=denominators(batches),
        denominator=sum(denominators(batches)), loss=first_loss, exact_loss=exact_loss,
        loss_rel_error=abs(first_loss - exact_loss) / abs(exact_loss) if exact_loss else None,
        grad_l2=global_norm(captured), exact_grad_l2=global_norm(exact),
        rel_l2=rel_l2(captured, exact), tied_head=spec.model_config().tie_embeddings,
        reference_shared=shared)


REFERENCE_DIR = "PARITY_REFERENCE_DIR"
"""Environment variable: where the cells of a run keep the exact references they computed,
one file per spec (harness.runner.cell_store); unset: every cell computes its own."""


def _exact_reference(spec, batches) -> tuple[float, dict, bool]:
    """(exact loss, exact gradient as a pure dict, whether it was read from the run's
    reference store). The reference depends only on the spec (weights, data, loss), which
    every arm of a shape shares, so the first cell of a shape computes it and writes it to
    $PARITY_REFERENCE_DIR/<spec hash>.msgpack (whole, by rename); the others read it."""
    import os
    from pathlib import Path

    from flax import serialization

    directory = os.environ.get(REFERENCE_DIR)
    path = Path(directory) / f"{spec.config_hash()}.msgpack" if directory else None
    if path is not None and path.exists():
        stored = serialization.msgpack_restore(path.read_bytes())
        return float(stored["loss"]), stored["gradient"], True
    exact_loss, exact = _compute_reference(spec, batches)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(serialization.msgpack_serialize(
            {"loss": exact_loss, "gradient": exact}))
        partial.replace(path)
    return exact_loss, exact, False


def _compute_reference(spec, batches) -> tuple[float, dict]:
    import jax
    from flax import nnx

    from arms.workload import exact_loss_and_gradient
    from engine.model import build_decoder, make_mesh

    # On one local device; where the arm ran on that same one-device mesh, its compiled
    # initializer is reused (same weights, no second compile).
    one_device = make_mesh("", devices=jax.local_devices()[:1])
    reference = build_decoder(spec.model_config(), seed=spec.seed, mesh=one_device)
    exact_loss, exact = exact_loss_and_gradient(reference, batches, spec.loss_fn())
    return exact_loss, jax.device_get(nnx.to_pure_dict(exact))


def exception_failure(err: Exception, run: CellRun) -> Failure:
    """The failure a cell's exception stands for: `oom`, `peer-died` (a multi-process cell
    whose collectives lost a process) or `exception`."""
    message = f"{type(err).__name__}: {err}"
    reason = "exception"
    if any(marker in message for marker in OOM_MARKERS):
        reason = "oom"
    elif run.distributed and any(marker in message for marker in PEER_MARKERS):
        reason = "peer-died"
        message = ("another process of this multi-process cell died, or did not reach the "
                   f"collective within gloo's timeout; this one stopped instead of hanging. "
                   f"{message}")
    return Failure(reason=reason, message=message, traceback=traceback.format_exc()[-4000:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Runs one parity cell (used by `parity run`).")
    parser.add_argument("--cell", required=True, help="CellRun as JSON")
    parser.add_argument("--out", required=True, help="file the record JSON is written to")
    parser.add_argument("--slices", type=int, default=0,
                        help="--cell is a list of one shape's cells, timed in this many "
                        "alternating slices in this process (harness.paired); the records "
                        "go to --out as a JSON list")
    parser.add_argument("--gate-fd", type=int, default=-1,
                        help="with --slices: a socket the parent times the slices through "
                        "(lockstep A/B, harness.lockstep): ready after warmup, each slice when "
                        "told")
    args = parser.parse_args(argv)
    import os

    spawned = os.environ.get(SPAWNED_AT)
    phases = Phases(float(spawned) if spawned else None)
    from harness.environment import environment

    if args.slices:
        return _paired_main(json.loads(args.cell), args.slices, args.out, phases,
                            args.gate_fd)
    run = CellRun(**json.loads(args.cell))

    try:
        init_distributed(run)
        record = run_cell(run, phases)
    except Exception as err:  # recorded, not raised: the grid goes on
        record = Record(status="failed", error=exception_failure(err, run))
    record.environment = section(Environment, environment())
    phases.end("record")
    record.phases = phases.seconds
    with open(args.out, "w") as out:
        json.dump(record.to_json(), out)
    return 0 if record.ok else 1


def _paired_main(cells: list[dict], slices: int, out_path: str, phases: Phases,
                 gate_fd: int = -1) -> int:
    from harness.environment import environment
    from harness.lockstep import Gate
    from harness.paired import run_paired

    runs = [CellRun(**cell) for cell in cells]
    try:
        records = run_paired(runs, slices, phases, Gate(gate_fd) if gate_fd >= 0 else None)
    except Exception as err:  # recorded, not raised: every arm of the process failed
        records = [Record(status="failed", error=exception_failure(err, run)) for run in runs]
    env = section(Environment, environment())
    phases.end("record")
    for record in records:
        record.environment, record.phases = env, phases.seconds
    with open(out_path, "w") as out:
        json.dump([record.to_json() for record in records], out)
    return 0 if all(record.ok for record in records) else 1


if __name__ == "__main__":
    sys.exit(main())
