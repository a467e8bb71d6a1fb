import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.measure import cost, memory, timing
from harness.measure.devices import DEVICES, PEAK_BF16_FLOPS
from harness.system.allocator import HOST_MALLOC, keeps_large_blocks

REPO = Path(__file__).resolve().parents[3]

# A heap left short by fragmentation, then two blocks of BLOCK taken at once, as executions
# take their temps: the pages faulted in while taking them, with and without
# reserve_heap(2 * BLOCK) first. BLOCK/2 carved out of a freed BLOCK leaves no free block
# that fits, so without the reserve both come from fresh memory at the top of the heap.
_FRAGMENTED_HEAP = """
import ctypes, json, resource, sys
from harness.measure.memory import reserve_heap
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
BLOCK = 64 << 20
first = libc.malloc(BLOCK); ctypes.memset(first, 0, BLOCK)
after = libc.malloc(BLOCK // 8)  # too big for any block freed before: it lies after `first`
libc.free(first)
half = libc.malloc(BLOCK // 2)
reserved = reserve_heap(2 * BLOCK) if sys.argv[1] == "reserve" else 0
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
blocks = [libc.malloc(BLOCK), libc.malloc(BLOCK)]
for block in blocks:
    ctypes.memset(block, 1, BLOCK)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps([reserved, faults, BLOCK // resource.getpagesize()]))
"""


def _fragmented_heap(reserve: bool, env: dict) -> tuple[int, int, int]:
    env = {**env, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _FRAGMENTED_HEAP,
                           "reserve" if reserve else "none"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return tuple(json.loads(proc.stdout.splitlines()[-1]))


def test_reserved_heap_serves_later_blocks_without_faulting_a_page_in():
    """Where glibc keeps freed memory, blocks taken after the heap reserve come from memory
    already faulted in; without it they fault in every page. Page-fault counts do not
    depend on machine load."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.update(HOST_MALLOC)
    reserved, without, pages = _fragmented_heap(False, env)
    assert reserved == 0 and without >= 2 * pages
    reserved, faults, pages = _fragmented_heap(True, env)
    assert reserved == 2 * pages * os.sysconf("SC_PAGE_SIZE")
    assert faults <= pages // 100


def test_heap_reserve_runs_only_where_glibc_keeps_freed_memory(monkeypatch):
    for name in ("MALLOC_MMAP_MAX_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert not keeps_large_blocks(os.environ)
    assert memory.reserve_heap(1 << 20) == 0  # glibc's defaults: big blocks are mmapped
    assert keeps_large_blocks({"MALLOC_MMAP_MAX_": "0"})
    assert keeps_large_blocks({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0"})
    assert keeps_large_blocks(
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0"})
    assert not keeps_large_blocks({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=8"})
    assert not keeps_large_blocks({"GLIBC_TUNABLES": "glibc.malloc.mmap_max=07"})
    monkeypatch.setenv("MALLOC_MMAP_MAX_", "0")
    assert memory.reserve_heap(0) == 0
    huge = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.reserve_heap(huge) == 0  # would take over half the free memory: skipped


def test_populate_faults_a_range_in_with_one_call():
    """The reserve's pages are faulted in by one madvise(MADV_POPULATE_WRITE) rather than a
    trap per page (6x cheaper on this VM); touching them afterwards faults nothing in."""
    import ctypes
    import resource

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
    nbytes = 64 << 20  # above glibc's mmap threshold here: fresh, untouched pages
    block = libc.malloc(nbytes)
    try:
        assert memory.populate(libc, block, nbytes)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ctypes.memset(block, 1, nbytes)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        libc.free(block)
    assert faults <= nbytes // resource.getpagesize() // 100


def test_tpu7x_peaks_are_per_device_half_the_chip():
    """JAX shows each TPU7x chip as two devices: a device's peak is half the chip's 2307
    TFLOP/s bf16 (and half its HBM), or every TPU7x MFU would read half its value."""
    spec = DEVICES["TPU7x"]
    assert spec.devices_per_chip == 2
    assert PEAK_BF16_FLOPS["TPU7x"] == spec.bf16_flops == 2307e12 / 2
    assert spec.hbm_bytes == 192e9 / 2
    assert all(s.source for s in DEVICES.values())


def test_mfu_of_a_tpu7x_record_uses_the_per_device_peak():
    import jax
    import jax.numpy as jnp

    compiled = jax.jit(lambda x: x @ x).lower(jnp.ones((8, 8))).compile()
    step = cost.cost({"step": compiled}, {"step": 1}, model_flops=9.228e14, median_ms=500.0,
                     device_kind="TPU7x", device_count=8)
    # 9.228e14 FLOP in 0.5 s on 8 devices (4 chips) of 1153.5 TFLOP/s each: 0.2 of the peak
    # (with the per-chip figure per device it would read 0.1)
    assert abs(step.mfu_vs_bf16_peak - 0.2) < 1e-12


def test_device_peaks_say_why_a_backend_has_none(devices):
    """XLA:CPU has no memory_stats: each device's peak is None and the record says why,
    rather than reading 0."""
    peaks, why = memory.device_peaks(devices[:3])
    assert peaks == [None, None, None]
    assert why == "memory_stats() is None on this backend"
    assert memory.device_stats(devices[:3]) == [None, None, None]


def test_the_machine_noise_reading_times_the_fixed_probe_around_a_block():
    with timing.machine_noise() as noise:
        assert len(noise["probe_ms"]) == 3  # taken before the block
    assert len(noise["probe_ms"]) == 6 and all(ms > 0 for ms in noise["probe_ms"])
    assert noise["steal"] is None or 0.0 <= noise["steal"] <= 1.0


def test_other_processes_busy_during_a_block_show_as_other_load():
    # A child process spins for the whole block: on any machine it keeps one CPU busy, so
    # the machine's busy time less this process's own is at least most of one CPU's share.
    spin = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                             "while time.time() - t < 3: pass"])
    try:
        time.sleep(0.3)
        with timing.machine_noise() as busy:
            time.sleep(1.5)
    finally:
        spin.wait(timeout=30)
    if busy["other_load"] is None:
        pytest.skip("/proc/stat is not readable here")
    assert busy["other_load"] >= 0.6 / os.cpu_count()  # other load only adds to this


def test_the_cells_own_cpu_time_is_not_other_load(monkeypatch):
    # (steal, machine busy, machine total, this process) CPU seconds, before and after: the
    # machine was busy 3 of 8 CPU seconds, 2 of them this process's own.
    readings = iter([(1.0, 10.0, 100.0, 5.0), (1.4, 13.0, 108.0, 7.0)])
    monkeypatch.setattr(timing, "cpu_seconds", lambda: next(readings))
    with timing.machine_noise() as noise:
        pass
    assert noise["other_load"] == pytest.approx(1 / 8) and noise["steal"] == pytest.approx(0.05)
