"""Timing a cell's steps: per-step wall, dispatch and wait; their statistics; garbage-
collector pauses; and readings of the machine beside the window (a fixed-work probe, steal
and other processes' load) that no arm's code can change."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Iterator, Mapping

import numpy as np

from reports.record import StepStats


def timed_steps(step, steps: int, block) -> tuple[list[float], list[float], list[float]]:
    """Runs `step()` `steps` times, blocking on each result: (wall, dispatch, wait) in ms."""
    step_ms, dispatch_ms, wait_ms = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        out = step()
        t1 = time.perf_counter()
        block(out)
        t2 = time.perf_counter()
        step_ms.append((t2 - t0) * 1e3)
        dispatch_ms.append((t1 - t0) * 1e3)
        wait_ms.append((t2 - t1) * 1e3)
    return step_ms, dispatch_ms, wait_ms


_PROBE_DATA = np.random.default_rng(0).random(200_000)


def probe_ms(repeats: int = 3) -> list[float]:
    """Wall ms of a fixed piece of host work (sorting the same 200,000 floats, one thread),
    `repeats` times: a reading of the machine's speed, taken beside a timed window, that no
    arm's code can change. Processes whose probes differ ran on a machine that differed."""
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.sort(_PROBE_DATA)
        out.append((time.perf_counter() - start) * 1e3)
    return out


def cpu_seconds() -> tuple[float, float, float, float] | None:
    """(steal, busy, total) CPU seconds of the whole machine since boot, from /proc/stat
    (Linux), and this process's own CPU seconds (every thread; children not included)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    fields += [0] * (8 - len(fields))
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    own = os.times()
    return (steal / tick, (user + nice + system + irq + softirq) / tick,
            sum(fields[:8]) / tick, own.user + own.system)


class NoiseMeter:
    """Readings of the machine over the windows it is told about (`window`), that no arm's
    code changes:
    - `probe_ms`: the fixed-work probe, 3 times when the meter starts and 3 at `close`;
    - `other_load`: the share of the machine's CPU time, summed over the windows, that
      other processes were busy (the machine's busy time less this process's own), 0 on an
      otherwise idle machine;
    - `steal`: the share the hypervisor gave to other guests in those windows.
    Both shares are None where /proc/stat is not readable. A process that waits between
    its windows while another process runs (lockstep A/B) counts only its own windows, so
    its partner's slices are not read as other load."""

    def __init__(self):
        self.found: dict = {"probe_ms": probe_ms(), "steal": None, "other_load": None}
        self._spent: list[float] | None = [0.0] * 4
        """(steal, busy, total, own) CPU seconds over the windows; None if one was unread."""

    @contextlib.contextmanager
    def window(self) -> Iterator[None]:
        before = cpu_seconds()
        yield
        after = cpu_seconds()
        if before is None or after is None or self._spent is None:
            self._spent = None
        else:
            self._spent = [s + (a - b) for s, a, b in zip(self._spent, after, before,
                                                          strict=True)]

    def close(self) -> dict:
        """The readings (the dict `found`, filled in)."""
        self.found["probe_ms"] += probe_ms()
        if self._spent is not None and self._spent[2] > 0:
            steal, busy, total, own = self._spent
            # /proc/stat's per-CPU counters are not read at one instant (and idle can step
            # back on tickless kernels), so over a short block a share can fall outside [0, 1].
            self.found["steal"] = min(1.0, max(0.0, steal / total))
            self.found["other_load"] = min(1.0, max(0.0, (busy - own) / total))
        return self.found


@contextlib.contextmanager
def machine_noise() -> Iterator[dict]:
    """Yields a dict filled on exit with the `NoiseMeter` readings of the block."""
    meter = NoiseMeter()
    with meter.window():
        yield meter.found
    meter.close()


def step_stats(samples_ms: list[float]) -> StepStats:
    """median, mean, max, min, p90 and CV (stdev / mean) of per-step times in ms."""
    if not samples_ms:
        raise ValueError("no timed steps: --steps must be >= 1")
    array = np.asarray(samples_ms, np.float64)
    mean = float(array.mean())
    return StepStats(
        median_ms=float(np.median(array)), mean_ms=mean, max_ms=float(array.max()),
        min_ms=float(array.min()), p90_ms=float(np.percentile(array, 90)),
        cv=float(statistics.stdev(array) / mean) if len(array) > 1 and mean else 0.0)


@dataclasses.dataclass
class GCPauses:
    """Counts garbage-collector runs and their total time while active."""

    count: int = 0
    total_ms: float = 0.0
    _start: float | None = None

    def _callback(self, phase: str, info: Mapping) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.count += 1
            self.total_ms += (time.perf_counter() - self._start) * 1e3
            self._start = None

    @contextlib.contextmanager
    def watch(self) -> Iterator[GCPauses]:
        gc.callbacks.append(self._callback)
        try:
            yield self
        finally:
            gc.callbacks.remove(self._callback)


def settle_heap() -> None:
    """One full garbage collection, run just before a timed window.

    Building and compiling a cell leaves many container objects alive or cyclic (modules,
    jaxprs, lowered programs). CPython collects its oldest generation only once enough
    objects have survived since the last full collection, so without this the first full
    collection after start-up lands in whichever timed step crosses that threshold: an arm
    that allocates more per step (a split engine dispatching 5 kernels at GA 4) pays one
    150-250 ms pause inside its window while a single-jit arm crosses it after the window.
    After a full collection the threshold is a quarter of the surviving heap away, so every
    arm's window sees the steady-state collector; `GCPauses` still records what it does.
    """
    gc.collect()
