"""The phases of a cell that measure it, each a small function returning its section of the
record (harness.cell.run strings them together; harness.cell.paired times several arms)."""

from __future__ import annotations

import math
import time

from harness.cell.phases import CompileCounter, host_gather
from harness.contract import STEP_ANNOTATION, CellRun
from harness.measure import memory as measure_memory
from harness.measure import timing as measure_timing
from harness.measure.cost import cost as step_cost
from harness.measure.flops import model_flops_per_step
from reports.record import (
    Cost,
    ExecutableMemory,
    GCPauses,
    HostMemory,
    Memory,
    Timing,
    Trace,
)


def block(out) -> None:
    """Waits until `out` (a step's outputs) is computed."""
    import jax

    jax.block_until_ready(out)


def build_arm(arm):
    """(`arm` built, build seconds): model, trainer and every executable a step runs."""
    start = time.perf_counter()
    arm.build()
    return arm, time.perf_counter() - start


def warm_up(arm, batches, run: CellRun) -> float:
    """Runs the warmup steps; returns the first one's loss."""
    block(arm.step(batches))
    first_loss = arm.last_loss()
    if not math.isfinite(first_loss):
        raise FloatingPointError(f"non-finite loss {first_loss} at step 1 of arm {run.arm}; "
                                 "check the learning rate, dtype and data of this cell")
    for _ in range(run.warmup - 1):
        block(arm.step(batches))
    return first_loss


def parity_step(choice, spec) -> tuple[dict, float, float | None]:
    """(the gradient its optimizer saw, loss, trainer's denominator) of the first step of
    a fresh arm of `choice` on `spec`, built, stepped once and closed here: after the
    measured arm is gone, so nothing of the check is in the process while it is timed (on
    the TPU v5e host, cells that held a 2.4 GB host copy of qwen3-0.6b's gradient through
    the timed window dispatched 0.2-1.7 ms a step slower than unchecked ones). The same
    weights and batches make the same first step, and its compiles are the measured arm's,
    loaded from the run's cache. The gradient is read back from the optimizer's own state
    (Arm.seen_gradient), on the host in our decoder's layout."""
    arm, _ = build_arm(choice.make(spec))
    block(arm.step(arm.place(spec.micro_batches(0))))
    found = (arm.seen_gradient(host_gather), arm.last_loss(), arm.trainer_denominator())
    arm.close()
    return found


def gradient_check(choice, spec, phases=None):
    """(parity, why it gave no verdict) of arm `choice` on `spec`, once the measured arms
    are gone: its parity step (`parity_step`) on an emptied device, then the reference
    (harness.cell.reference.checked_parity) on the device emptied again. A parity step that
    fails gives no verdict, and why; the measurements stand. With `phases`, each of the two
    ends a phase of its own ("parity step", then "reference" where it ran)."""
    from harness.cell.reference import checked_parity, why_not_checked

    release_device_memory()
    try:
        first_step = parity_step(choice, spec)
    except Exception as err:  # kept as the record's reason; the measurements stand
        return None, why_not_checked(err)
    finally:
        release_device_memory()
        if phases is not None:
            phases.end("parity step")
    checked = checked_parity(spec, *first_step)
    if phases is not None:
        phases.end("reference")
    return checked


def timed_window(arm, batches, run: CellRun, spec, compiles,
                 build_s: float) -> tuple[Timing, int | None]:
    """The untraced timed window: per-step wall, dispatch and wait; GC pauses; recompiles.
    Also returns the process's RSS high-water growth over the window (for Memory)."""
    compiled_before = compiles.count
    measure_timing.settle_heap()
    gc_pauses = measure_timing.GCPauses()
    with measure_timing.machine_noise() as noise, gc_pauses.watch(), \
            measure_memory.rss_high_water() as rss:
        step_ms, dispatch_ms, wait_ms = measure_timing.timed_steps(lambda: arm.step(batches),
                                                            run.steps, block)
    timing = timing_record(arm, run, spec, (step_ms, dispatch_ms, wait_ms), gc_pauses,
                           compiles.count - compiled_before, compiles, build_s, noise)
    return timing, rss["rss_delta_bytes"]


def timing_record(arm, run: CellRun, spec, samples: tuple[list, list, list], gc_pauses,
                  recompiles: int, compiles: CompileCounter, build_s: float, noise: dict,
                  slices: list[int] | None = None) -> Timing:
    """The record's Timing from a timed window's (wall, dispatch, wait) ms per step, its GC
    pauses, compiles after warmup, the machine-noise reading and, for in-process pairing,
    the slices the steps ran in."""
    step_ms, dispatch_ms, wait_ms = samples
    stats = measure_timing.step_stats(step_ms)
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


def planned_memory(executables, held: dict[str, int]) -> dict[str, ExecutableMemory | None]:
    """Each executable's memory analysis, with the train state `held` beside it while it
    runs (arms.base.Arm.held_bytes)."""
    return {name: measure_memory.executable_memory(c, held.get(name, 0))
            for name, c in executables.items()}


def planned_peak(planned: dict[str, ExecutableMemory | None],
                 calls: dict[str, int]) -> int | None:
    """The most the step has in device memory by plan: the maximum, over the executables it
    calls, of total + held (an executable it compiled but never calls adds nothing)."""
    return max((m.total + m.held for name, m in planned.items() if m and calls.get(name)),
               default=None)


def reserve_heap(planned: dict[str, ExecutableMemory | None]) -> int:
    """On the CPU backend, faults in host heap for the executions of the timed window before
    it starts: a multiple of the largest execution's fresh bytes (temp, and outputs not
    written in place); see harness.measure_memory.reserve_heap. An accelerator's plan is device
    memory, which its runtime pools itself."""
    import jax

    if jax.default_backend() != "cpu":
        return 0
    fresh = max((m.temp + m.output - m.alias for m in planned.values() if m), default=0)
    return measure_memory.reserve_heap(measure_memory.RESERVE_PER_EXECUTION * fresh)


def memory_section(planned, calls: dict[str, int], rss: int | None, reserved: int) -> Memory:
    """Each executable's planned memory (`calls` per step), the device peak and the timed
    window's RSS growth, per host."""
    import jax
    import numpy as np

    per_device, why = measure_memory.device_peaks(jax.local_devices())
    peak = max((p for p in per_device if p is not None), default=None)
    return Memory(peak_bytes_in_use=peak, peak_bytes_per_device=per_device,
                  peak_unavailable=why, executables=planned,
                  planned_bytes=planned_peak(planned, calls),
                  planned_unavailable=(None if any(planned.values())
                                       else "no executable has a memory analysis here"),
                  rss_delta_bytes=rss, hosts=per_host_memory(rss, peak, np),
                  heap_reserved_bytes=reserved,
                  device_stats=measure_memory.device_stats(jax.local_devices()))


def device_reading() -> list[dict[str, int] | None]:
    """Every local device's memory statistics now (None on a backend with none): read at a
    phase's end, so a record says when a peak was reached (a device's peak after the build
    and before any step is the build's)."""
    import jax

    return measure_memory.device_stats(jax.local_devices())


def cost_section(executables, calls: dict[str, int], median_ms: float, spec) -> Cost:
    import jax

    return step_cost(
        executables, calls,
        model_flops=model_flops_per_step(spec.model_config(), batch=spec.batch, seq=spec.seq),
        median_ms=median_ms, device_kind=jax.local_devices()[0].device_kind,
        device_count=jax.device_count())


def per_host_memory(rss_delta, peak, np) -> list[HostMemory]:
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


def release_device_memory() -> int:
    """Frees the device buffers the measured arm left (its closed trainer's state, its
    batches): garbage-collects what is no longer referenced, then deletes every array still
    alive, which only a cache outside the arm's control (a jitted closure over the model)
    can hold once the arm is gone. Returns the bytes deleted that way. What runs next (the
    gradient check) starts from an empty device, as the check's memory is sized."""
    import gc

    import jax

    gc.collect()
    left = jax.live_arrays()
    freed = sum(x.nbytes for x in left if not x.is_deleted())
    for array in left:
        array.delete()
    return freed


def traced_window(arm, batches, run: CellRun) -> Trace:
    import jax

    from harness.measure import trace

    with trace.capture(run.trace_dir, session=run.trace_session,
                       hlo=run.trace_hlo) as directory:
        for i in range(run.trace_steps):
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                block(arm.step(batches))
    path = trace.find_xplane(directory)
    steps = trace.parse_steps(path)
    return Trace(xplane=path, logdir=directory,
                 executions_per_step=[s.executions for s in steps],
                 modules_per_step=[list(s.modules) for s in steps],
                 step_ms=[s.wall_ns / 1e6 for s in steps],
                 busy_ms=[s.busy_ns / 1e6 for s in steps],
                 host_ms=[(s.wall_ns - s.busy_ns) / 1e6 for s in steps])

