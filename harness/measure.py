"""Measurement primitives: step-time statistics, GC pauses, RSS high-water, executable memory,
model and compiled FLOPs and bytes per step, MFU where the device's peak is known."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import os
import statistics
import sys
import time
from collections.abc import Iterator, Mapping

import numpy as np

from reports.record import Cost, ExecutableMemory, StepStats


@dataclasses.dataclass(frozen=True, kw_only=True)
class DeviceSpec:
    """What one JAX device of a kind can do at most (vendor datasheets), per JAX device: a
    chip JAX shows as two devices (TPU7x: one per TensorCore) gets half of each figure."""

    bf16_flops: float
    """Dense (no sparsity) bf16 peak FLOP/s."""
    hbm_bytes: float
    """HBM capacity."""
    hbm_bytes_per_s: float
    """HBM bandwidth."""
    devices_per_chip: int = 1
    source: str = ""


DEVICES: dict[str, DeviceSpec] = {
    # Google Cloud TPU docs (system architecture pages), per chip; v4 and v5p join their two
    # TensorCores into one device (megacore), v5e and v6e have one TensorCore per chip.
    "TPU v4": DeviceSpec(bf16_flops=275e12, hbm_bytes=32e9, hbm_bytes_per_s=1200e9,
                         source="cloud.google.com/tpu/docs/v4: 275 TFLOP/s, 32 GB, 1.2 TB/s"),
    "TPU v5 lite": DeviceSpec(bf16_flops=197e12, hbm_bytes=16e9, hbm_bytes_per_s=819e9,
                              source="cloud.google.com/tpu/docs/v5e: 197 TFLOP/s, 16 GB, "
                                     "819 GB/s"),
    "TPU v5": DeviceSpec(bf16_flops=459e12, hbm_bytes=95e9, hbm_bytes_per_s=2765e9,
                         source="cloud.google.com/tpu/docs/v5p: 459 TFLOP/s, 95 GB, 2765 GB/s"),
    "TPU v6 lite": DeviceSpec(bf16_flops=918e12, hbm_bytes=32e9, hbm_bytes_per_s=1640e9,
                              source="cloud.google.com/tpu/docs/v6e: 918 TFLOP/s, 32 GB, "
                                     "1640 GB/s"),
    # TPU7x (Ironwood): per chip 4614 TFLOP/s FP8 = 2307 bf16, 192 GB, 7.37 TB/s; JAX shows
    # each chip as two devices (8 on a 4-chip host), so a device has half of each.
    "TPU7x": DeviceSpec(bf16_flops=2307e12 / 2, hbm_bytes=192e9 / 2,
                        hbm_bytes_per_s=7.37e12 / 2, devices_per_chip=2,
                        source="cloud.google.com/tpu/docs/tpu7x, per chip: 2307 TFLOP/s bf16, "
                               "192 GB, 7.37 TB/s; halved: two devices per chip"),
    # NVIDIA datasheets: dense bf16 (the sparse figure is twice these).
    "NVIDIA H100 80GB HBM3": DeviceSpec(bf16_flops=989e12, hbm_bytes=80e9,
                                        hbm_bytes_per_s=3.35e12,
                                        source="H100 SXM datasheet: 989 TFLOP/s, 80 GB, "
                                               "3.35 TB/s"),
    "NVIDIA H200": DeviceSpec(bf16_flops=989e12, hbm_bytes=141e9, hbm_bytes_per_s=4.8e12,
                              source="H200 SXM datasheet: 989 TFLOP/s, 141 GB, 4.8 TB/s"),
    "NVIDIA B200": DeviceSpec(bf16_flops=2250e12, hbm_bytes=180e9, hbm_bytes_per_s=8e12,
                              source="DGX B200 datasheet per GPU: 2.25 PFLOP/s dense, "
                                     "180 GB, 8 TB/s"),
    # AMD Instinct datasheets: dense bf16.
    "AMD Instinct MI300X": DeviceSpec(bf16_flops=1307.4e12, hbm_bytes=192e9,
                                      hbm_bytes_per_s=5.3e12,
                                      source="MI300X datasheet: 1307.4 TFLOP/s, 192 GB, "
                                             "5.3 TB/s"),
    "AMD Instinct MI355X": DeviceSpec(bf16_flops=2516.6e12, hbm_bytes=288e9,
                                      hbm_bytes_per_s=8e12,
                                      source="MI355X datasheet: 2516.6 TFLOP/s, 288 GB, "
                                             "8 TB/s"),
}
"""Per JAX device, by `device_kind`; kinds not listed (CPU included) report FLOP/s without
MFU."""

PEAK_BF16_FLOPS: dict[str, float] = {kind: spec.bf16_flops for kind, spec in DEVICES.items()}
"""Dense bf16 peak FLOP/s per JAX device, by `device_kind` (MFU's denominator)."""


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


def _cpu_seconds() -> tuple[float, float, float, float] | None:
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
        before = _cpu_seconds()
        yield
        after = _cpu_seconds()
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


def heap_keeps_large_blocks(env: Mapping[str, str]) -> bool:
    """Whether glibc serves every request from the process heap and keeps what is freed there
    (harness.runner.HOST_MALLOC, or the same set as glibc tunables): only then does memory
    faulted in once stay mapped for the next execution to reuse."""
    tunables = env.get("GLIBC_TUNABLES", "").split(":")  # name=value:name=value
    no_mmap = (env.get("MALLOC_MMAP_MAX_") == "0" or "glibc.malloc.mmap_max=0" in tunables)
    return no_mmap and sys.platform.startswith("linux")


RESERVE_PER_EXECUTION = 4
"""Heap reserved before a timed window, in multiples of the largest execution's fresh bytes
(temp, and outputs not written in place). Measured at `small` on CPU: with 2, PeftTrainer at
GA 4 (four executions a step, params not donated) still grew its heap by 33-41 MiB inside a
12-step window in 2 of 2 processes; with 4, no arm grew it in 24 steps."""


def reserve_heap(nbytes: int) -> int:
    """Grows the process heap by `nbytes`, faults every page in and frees it again; returns
    the bytes reserved (0 where nothing was done).

    Where glibc keeps freed memory (heap_keeps_large_blocks), an execution's temp buffer is
    reused from the heap, but the heap is not at its high-water mark when warmup ends: a
    small allocation that lands in a freed temp's block leaves it too short, and a later
    execution takes a fresh block from the top of the heap and faults all of it in (the
    fused engine at `small` seq 128: 50k faults, +280 ms on a 118 ms step, in one step of
    a dozen, which one by chance). Reserving ahead of the timed window moves that growth
    before it: freed, the block joins the top of the heap, which is never trimmed, and later
    blocks are carved from pages already faulted in, the steady state an accelerator's pooled
    allocator starts in. Skipped where it would take over half the memory the system has free.
    """
    if nbytes <= 0 or not heap_keeps_large_blocks(os.environ):
        return 0
    if 2 * nbytes > os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
        return 0
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    block = libc.malloc(nbytes)
    if not block:
        return 0
    if not _populate(libc, block, nbytes):
        ctypes.memset(block, 0, nbytes)
    libc.free(block)
    return nbytes


MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault in every page of a range, writable, in one call."""


def _populate(libc, address: int, nbytes: int) -> bool:
    """Faults in the pages of [address, address + nbytes): the whole pages with one madvise
    call, the partial ones at either end by writing them; False where the kernel lacks
    MADV_POPULATE_WRITE (the caller then touches each page).
    The pages end up as a memset leaves them (resident, private, written), at a fraction of
    the cost where each page fault is a trap to a hypervisor (0.5 s for 800 MiB here, against
    3.1 s for memset)."""
    page = os.sysconf("SC_PAGE_SIZE")
    start = -(-address // page) * page
    length = (address + nbytes - start) // page * page
    if length <= 0:
        return False
    libc.madvise.restype = ctypes.c_int
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    if libc.madvise(start, length, MADV_POPULATE_WRITE) != 0:
        return False
    ctypes.memset(address, 0, start - address)
    ctypes.memset(start + length, 0, address + nbytes - start - length)
    return True


def _status_kib(field: str) -> int | None:
    try:
        with open(f"/proc/{os.getpid()}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


@contextlib.contextmanager
def rss_high_water() -> Iterator[dict]:
    """Process RSS high-water growth over the block (Linux: clear_refs resets VmHWM)."""
    result: dict = {"rss_delta_bytes": None}
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as refs:
            refs.write("5")
        before = _status_kib("VmRSS")
    except OSError:
        before = None
    yield result
    after = _status_kib("VmHWM")
    if before is not None and after is not None:
        result["rss_delta_bytes"] = max(0, after - before) * 1024


def executable_memory(compiled) -> ExecutableMemory | None:
    """argument + output - alias + temp bytes of one compiled executable (per device)."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # backends without the analysis
        return None
    if analysis is None:
        return None
    argument, output = analysis.argument_size_in_bytes, analysis.output_size_in_bytes
    alias, temp = analysis.alias_size_in_bytes, analysis.temp_size_in_bytes
    return ExecutableMemory(argument=argument, output=output, alias=alias, temp=temp,
                            total=argument + output - alias + temp,
                            generated_code=analysis.generated_code_size_in_bytes)


def per_step(per_executable: Mapping[str, float | None],
             calls: Mapping[str, int]) -> float | None:
    """sum over executables of value x calls per step; None if any value is missing."""
    if any(v is None for v in per_executable.values()):
        return None
    return sum(v * calls.get(n, 0) for n, v in per_executable.items())


def cost(executables: Mapping, calls: Mapping[str, int], *, model_flops: float,
         median_ms: float, device_kind: str, device_count: int) -> Cost:
    """The step's cost: model FLOPs (analytic, the same for every arm) with the FLOP/s they
    give at the median step time and MFU where the device's bf16 peak is known, and the
    compiled FLOPs and bytes accessed of every executable (loop-aware) x its calls per step.
    """
    from harness.flops import compiled_cost

    compiled = {name: compiled_cost(c) for name, c in executables.items()}
    flops_per_s = model_flops / (median_ms / 1e3)
    peak = PEAK_BF16_FLOPS.get(device_kind)
    flops = {name: c.flops for name, c in compiled.items()}
    accessed = {name: c.bytes_accessed for name, c in compiled.items()}
    return Cost(
        model_flops_per_step=model_flops, model_flops_per_s=flops_per_s,
        mfu_vs_bf16_peak=flops_per_s / (peak * device_count) if peak else None,
        compiled_flops_per_step=per_step(flops, calls),
        bytes_accessed_per_step=per_step(accessed, calls), calls_per_step=dict(calls),
        compiled_flops_per_executable=flops, bytes_accessed_per_executable=accessed,
        loop_trip_counts={name: list(c.trip_counts) for name, c in compiled.items()},
        unavailable={name: c.reason for name, c in compiled.items() if c.reason})


def device_peaks(devices) -> tuple[list[int | None], str | None]:
    """Each local device's memory_stats()['peak_bytes_in_use'] (the process's peak since it
    started: a cell is its own process), and why some are None: the backend has no
    memory_stats (CPU), or its stats lack the key."""
    peaks, missing = [], []
    for device in devices:
        stats = device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
        else:
            peaks.append(None)
            missing.append((device, stats))
    if not missing:
        return peaks, None
    device, stats = missing[0]
    why = ("memory_stats() is None on this backend" if stats is None else
           f"memory_stats() of {device} has no 'peak_bytes_in_use' (keys: "
           f"{', '.join(sorted(stats)) or 'none'})")
    return peaks, why
