"""Runs one cell in this (fresh) process and writes its record: `python -m harness.worker`.

Order inside the cell: build + compile (timed apart) -> the first warmup step, whose captured
gradient is kept for the parity check -> the other warmup steps -> the untraced timed window
(per-step wall, dispatch and wait; GC pauses; RSS high-water) -> memory and FLOPs of the
executables -> an optional traced window (never the timed one) -> the exact reference
gradient, computed last so its memory cannot pollute the measured peaks.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback

STEP_ANNOTATION = "train"


@dataclasses.dataclass(frozen=True, kw_only=True)
class CellRun:
    """One cell as the runner hands it to a worker."""

    arm: str
    """Arm name (arms.base.resolve)."""
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
    """Parent directory for the trace (a fresh subdirectory per capture)."""
    parity: bool = True
    """Compare the first step's captured gradient with the exact reference."""
    plugins: tuple[str, ...] = ()
    """Modules to import first (they may register extra arms, e.g. test-only ones)."""
    distributed: dict | None = None
    """jax.distributed settings: {"coordinator", "num_processes", "process_id"} (or
    {"auto": True} where JAX detects the cluster, e.g. Cloud TPU); None = one process."""
    heartbeat_s: int = 30
    """jax.distributed heartbeat timeout: how long a dead peer goes unnoticed."""


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


class CompileCounter:
    """Counts backend compiles through a jax.monitoring listener."""

    def __init__(self):
        import jax

        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1


def _block(out) -> None:
    import jax

    jax.block_until_ready(out)


def run_cell(run: CellRun) -> dict:
    """Measures one cell in this process; returns the record's measured sections."""
    import importlib

    for module in run.plugins:
        importlib.import_module(module)

    import jax
    import numpy as np

    from arms.base import make_arm
    from arms.spec import CellSpec
    from harness import measure

    if run.warmup < 1:
        raise ValueError("warmup must be >= 1 (the first warmup step is the parity step)")
    spec = CellSpec.from_dict(run.spec)
    compiles = CompileCounter()
    arm = make_arm(run.arm, spec)
    start = time.perf_counter()
    arm.build()
    build_s = time.perf_counter() - start
    batches = arm.place(spec.micro_batches(0))

    _block(arm.step(batches))  # warmup 1: the parity step
    first_loss = arm.last_loss()
    if not math.isfinite(first_loss):
        raise FloatingPointError(f"non-finite loss {first_loss} at step 1 of arm {run.arm}; "
                                 "check the learning rate, dtype and data of this cell")
    captured = host_gather(arm.captured_gradient()) if run.parity else None
    for _ in range(run.warmup - 1):
        _block(arm.step(batches))
    compiles_after_warmup = compiles.count

    gc_pauses = measure.GCPauses()
    with gc_pauses.watch(), measure.rss_high_water() as rss:
        step_ms, dispatch_ms, wait_ms = measure.timed_steps(lambda: arm.step(batches),
                                                            run.steps, _block)
    recompiles = compiles.count - compiles_after_warmup
    summary = measure.summarize(step_ms)
    tokens = spec.batch * spec.seq

    executables = arm.executables()
    calls = arm.kernel_calls_per_step()
    memory = {name: measure.executable_memory(c) for name, c in executables.items()}
    flops = {name: measure.executable_flops(c) for name, c in executables.items()}
    accessed = {name: measure.executable_bytes(c) for name, c in executables.items()}
    step_flops, step_bytes = _per_step(flops, calls), _per_step(accessed, calls)
    device = jax.local_devices()[0]
    peak = measure.PEAK_BF16_FLOPS.get(device.device_kind)
    flops_per_s = step_flops / (summary["median_ms"] / 1e3) if step_flops else None
    record = {
        "about": arm.about(),
        "timing": {
            "steps": run.steps, "warmup": run.warmup, "step_ms": step_ms,
            "dispatch_ms": dispatch_ms, "wait_ms": wait_ms, "summary": summary,
            "gc": {"count": gc_pauses.count, "total_ms": gc_pauses.total_ms},
            "tokens_per_step": tokens,
            "tokens_per_s": tokens / (summary["median_ms"] / 1e3),
            "build_s": build_s, "compile_s": arm.compile_seconds,
            "recompiles_after_warmup": recompiles,
            "executions_per_step_dispatched": arm.executions_per_step(),
        },
        "flops": {
            "per_step": step_flops, "flops_per_s": flops_per_s,
            "mfu_vs_bf16_peak": (flops_per_s / (peak * jax.device_count())
                                 if flops_per_s and peak else None),
            "per_executable": flops, "calls_per_step": calls,
            "bytes_accessed_per_step": step_bytes, "bytes_accessed_per_executable": accessed,
        },
        "memory": {
            "peak_bytes_in_use": measure.peak_bytes_in_use(jax.local_devices()),
            "executables": memory,
            "planned_bytes": max((m["total"] for m in memory.values() if m), default=None),
            "rss_delta_bytes": rss["rss_delta_bytes"],
            "hosts": _per_host_memory(rss["rss_delta_bytes"],
                                      measure.peak_bytes_in_use(jax.local_devices()), np),
        },
        "trace": _traced_window(arm, batches, run) if run.trace else None,
        "parity": _parity(spec, captured, first_loss) if run.parity else None,
    }
    arm.close()
    return record


def _per_step(per_executable: dict, calls: dict) -> float | None:
    """sum over executables of value x calls per step; None if any value is missing."""
    if any(v is None for v in per_executable.values()):
        return None
    return sum(v * calls.get(n, 0) for n, v in per_executable.items())


def _per_host_memory(rss_delta, peak, np) -> list[dict]:
    """[{process, rss_delta_bytes, peak_bytes_in_use}] for every process of the cell."""
    import jax

    # KiB in int32: process_allgather goes through jax arrays (int64 needs x64 mode).
    mine = np.array([[jax.process_index(), -1 if rss_delta is None else rss_delta // 1024,
                      -1 if peak is None else peak // 1024]], np.int32)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        mine = np.asarray(multihost_utils.process_allgather(mine, tiled=True))
    return [{"process": int(p), "rss_delta_bytes": None if r < 0 else int(r) * 1024,
             "peak_bytes_in_use": None if k < 0 else int(k) * 1024} for p, r, k in mine]


def _traced_window(arm, batches, run: CellRun) -> dict:
    import jax

    from harness import trace

    with trace.capture(run.trace_dir) as directory:
        for i in range(run.trace_steps):
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                _block(arm.step(batches))
    path = trace.find_xplane(directory)
    steps = trace.parse_steps(path)
    return {
        "xplane": path, "logdir": directory,
        "executions_per_step": [s.executions for s in steps],
        "modules_per_step": [list(s.modules) for s in steps],
        "step_ms": [s.wall_ns / 1e6 for s in steps],
        "busy_ms": [s.busy_ns / 1e6 for s in steps],
        "host_ms": [(s.wall_ns - s.busy_ns) / 1e6 for s in steps],
    }


def _parity(spec, captured, first_loss: float) -> dict:
    from arms.workload import (
        denominators,
        exact_loss_and_gradient,
        fingerprint,
        global_norm,
        rel_l2,
    )
    from engine.model import build_decoder

    batches = spec.micro_batches(0)
    reference = build_decoder(spec.model_config(), seed=spec.seed)
    exact_loss, exact = exact_loss_and_gradient(reference, batches, spec.loss_fn())
    return {
        "data_fingerprint": fingerprint(batches),
        "denominators": denominators(batches),
        "denominator": sum(denominators(batches)),
        "loss": first_loss, "exact_loss": exact_loss,
        "loss_rel_error": abs(first_loss - exact_loss) / abs(exact_loss) if exact_loss else None,
        "grad_l2": global_norm(captured), "exact_grad_l2": global_norm(exact),
        "rel_l2": rel_l2(captured, exact),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Runs one parity cell (used by `parity run`).")
    parser.add_argument("--cell", required=True, help="CellRun as JSON")
    parser.add_argument("--out", required=True, help="file the record JSON is written to")
    args = parser.parse_args(argv)
    run = CellRun(**json.loads(args.cell))
    from harness.fingerprint import environment

    try:
        init_distributed(run)
        measured = run_cell(run)
        result = {"status": "ok", "error": None, **measured}
    except Exception as err:  # recorded, not raised: the grid goes on
        result = {"status": "failed",
                  "error": {"reason": "exception", "message": f"{type(err).__name__}: {err}",
                            "traceback": traceback.format_exc()[-4000:]}}
    result["fingerprint"] = environment()
    with open(args.out, "w") as out:
        json.dump(result, out)
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
