"""Memory a cell uses: each executable's planned memory, the devices' peaks, the process's
RSS high-water over its timed window, and (on the CPU backend) host heap reserved before it."""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator

from harness.system.allocator import keeps_large_blocks
from reports.record import ExecutableMemory

RESERVE_PER_EXECUTION = 4
"""Heap reserved before a timed window, in multiples of the largest execution's fresh bytes
(temp, and outputs not written in place). Measured at `small` on CPU: with 2, PeftTrainer at
GA 4 (four executions a step, params not donated) still grew its heap by 33-41 MiB inside a
12-step window in 2 of 2 processes; with 4, no arm grew it in 24 steps."""


def reserve_heap(nbytes: int) -> int:
    """Grows the process heap by `nbytes`, faults every page in and frees it again; returns
    the bytes reserved (0 where nothing was done).

    Where glibc keeps freed memory (harness.system.allocator.keeps_large_blocks), an
    execution's temp buffer is reused from the heap, but the heap is not at its high-water
    mark when warmup ends: a small allocation that lands in a freed temp's block leaves it
    too short, and a later
    execution takes a fresh block from the top of the heap and faults all of it in (the
    fused engine at `small` seq 128: 50k faults, +280 ms on a 118 ms step, in one step of
    a dozen, which one by chance). Reserving ahead of the timed window moves that growth
    before it: freed, the block joins the top of the heap, which is never trimmed, and later
    blocks are carved from pages already faulted in, the steady state an accelerator's pooled
    allocator starts in. Skipped where it would take over half the memory the system has free.
    """
    if nbytes <= 0 or not keeps_large_blocks(os.environ):
        return 0
    if 2 * nbytes > os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"):
        return 0
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    block = libc.malloc(nbytes)
    if not block:
        return 0
    if not populate(libc, block, nbytes):
        ctypes.memset(block, 0, nbytes)
    libc.free(block)
    return nbytes


MADV_POPULATE_WRITE = 23
"""Linux 5.14+: fault in every page of a range, writable, in one call."""


def populate(libc, address: int, nbytes: int) -> bool:
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


def executable_memory(compiled, held: int = 0) -> ExecutableMemory | None:
    """argument + output - alias + temp bytes of one compiled executable (per device), and
    the `held` bytes of train state in memory beside it while it runs."""
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
                            generated_code=analysis.generated_code_size_in_bytes, held=held)



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


def device_stats(devices) -> list[dict[str, int] | None]:
    """Each device's whole `memory_stats()` (its integer figures), None where the backend
    has none (CPU)."""
    return [None if (stats := device.memory_stats()) is None else
            {k: int(v) for k, v in sorted(stats.items()) if isinstance(v, int)}
            for device in devices]
