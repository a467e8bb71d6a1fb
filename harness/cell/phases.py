"""The start of a cell's process: its phases' clock, joining a multi-process cell, and the
backend started with the run's compilation cache, from which compiles are counted."""

from __future__ import annotations

import importlib.util
import os
import time

from harness.contract import COMPILE_CACHE, CellRun


class Phases:
    """Wall seconds of each phase of the cell's process, in the order they ran (the record's
    `phases`): where a cell's time goes, so waste can be found by measuring."""

    def __init__(self, spawned_at: float | None = None, progress: str | None = None):
        self.seconds: dict[str, float] = {}
        self._progress = progress
        """A file each ended phase is appended to (harness.contract.progress_file)."""
        self.listeners: list = []
        """Called with each phase's name as it ends (the compile log labels its entries)."""
        if spawned_at is not None:
            self.seconds["start"] = max(0.0, time.time() - spawned_at)
            self._note("start")
        self._last = time.perf_counter()

    def _note(self, name: str) -> None:
        if self._progress:
            with open(self._progress, "a") as out:
                out.write(f"{name} {self.seconds[name]:.1f}\n")

    def end(self, name: str, *, less: dict[str, float] | None = None) -> None:
        """Ends phase `name` now (its time since the previous phase ended); the seconds in
        `less` are phases measured inside it, recorded under their own names instead."""
        now = time.perf_counter()
        spent = now - self._last
        for inner, seconds in (less or {}).items():
            self.seconds[inner] = self.seconds.get(inner, 0.0) + seconds
            spent -= seconds
        self.seconds[name] = self.seconds.get(name, 0.0) + max(0.0, spent)
        self._note(name)
        for listener in self.listeners:
            listener(name)
        self._last = now


def init_distributed(run: CellRun) -> None:
    """Joins the cell's processes before the backend starts (CPU: gloo collectives)."""
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


COMPILE_CACHE_BOUND = 64 * 2**30
"""The compilation cache's size bound, where the `filelock` package is installed: JAX locks
its cache directory around each read and write only where it may evict (a bound is set),
which two processes sharing one cache at once need (lockstep A/B sides given one kept
cache). JAX refuses a bound without `filelock` by turning its cache off altogether (measured
on the TPU v5e host, whose stack has no filelock: every compile cold, the fit check's
programs compiled again by the build), so there the cache runs unbounded and unlocked, as
JAX's default; a run's own cells use it one at a time."""


def use_compile_cache() -> None:
    """Points JAX's persistent compilation cache at $PARITY_COMPILE_CACHE (every program,
    however quick to compile), where one is given. A program
    loaded from it is the executable a cold compile would build (same cost and memory
    analysis); only the compile seconds differ, and the record counts the hits."""
    path = os.environ.get(COMPILE_CACHE)
    if not path:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", COMPILE_CACHE_BOUND)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


class CompileCounter:
    """Counts backend compiles (cold, or loaded from the persistent compilation cache: JAX
    reports both as a backend compile), their seconds and, of those, the cache hits, through
    jax.monitoring listeners; and logs each one (`log`: the program's name, its seconds,
    whether it was loaded, and the phase it happened in, `label`), so a record says which
    programs a cell compiled and that none was compiled twice."""

    def __init__(self):
        import jax

        self.count = 0
        self.seconds = 0.0
        self.cache_hits = 0
        self.log: list[dict] = []
        """One entry per backend compile: {"program", "seconds", "cached", "phase"}."""
        self._hit = False
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            self.seconds += duration
            # JAX reports a persistent-cache hit from inside the compile call it serves,
            # before that call's duration: the hit belongs to this entry.
            self.log.append({"program": str(kwargs.get("fun_name", "?")),
                             "seconds": round(duration, 3), "cached": self._hit,
                             "phase": None})
            self._hit = False

    def _on_event(self, event: str, **kwargs) -> None:
        if event == "/jax/compilation_cache/cache_hits":
            self.cache_hits += 1
            self._hit = True

    def label(self, phase: str) -> None:
        """Names `phase` as where every compile logged since the last label happened."""
        for entry in self.log:
            if entry["phase"] is None:
                entry["phase"] = phase


def start_backend(phases: Phases) -> CompileCounter:
    """Starts JAX's backend with the run's compilation cache; from here compiles are
    counted (the returned counter)."""
    import jax

    use_compile_cache()
    jax.devices()
    compiles = CompileCounter()
    phases.listeners.append(compiles.label)
    phases.end("backend")
    return compiles

