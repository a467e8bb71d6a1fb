"""The host allocator a cell process runs on: the one owner of that policy.

Timed cells on the CPU backend run on glibc's malloc told to keep what is freed
(`HOST_MALLOC`); plan processes, which compile for a TPU target and run nothing, preload
mimalloc (`compile_env`). A user's own allocator settings (a glibc `MALLOC_*` variable, a
preloaded malloc) are kept instead, either way. Whatever ran is recorded (`describe`), so
records of different allocators are not compared. Standard library only.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Mapping
from pathlib import Path

HOST_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
               "MALLOC_TRIM_THRESHOLD_": str(2**32 - 1)}
"""glibc settings for cells on the CPU backend: freed memory stays in the process.

XLA's CPU runtime mallocs each execution's temp buffer and frees it when the execution ends.
By default glibc serves a request over 32 MiB with a fresh mmap, gives each worker thread an
arena whose emptied heaps are unmapped, and trims the main heap's top: each way, the next
execution faults its temp in again page by page, a cost of executions x temp size (the split
engine at `small` seq 128 GA 4: 48k page faults, 190 MiB, per step; the single-jit arms 17k).
An accelerator runtime pools device memory and pays none of this, so the CPU proxy turns it
off: one arena, no mmap, no trim (all three are needed; any two leave the faults). The cost
is a resident set that stays at its high-water mark."""

MIMALLOC = Path(sysconfig.get_paths()["purelib"]) / "cmeel.prefix" / "lib" / "libmimalloc.so.3"
"""mimalloc's shared library, from the pinned `cmeel-mimalloc` wheel."""

COMPILE_MALLOC = {"MIMALLOC_PURGE_DELAY": "-1", "MIMALLOC_ARENA_EAGER_COMMIT": "1"}
"""mimalloc's settings for a compile: memory freed stays in the process (never purged back
to the OS) and arenas are committed whole, so the compile's churn of short-lived objects
stops costing page faults; the price is a resident set at its high-water mark."""


def describe(env: Mapping[str, str]) -> str:
    """The allocator settings in `env`, as `K=V K=V`: glibc's `MALLOC_*` variables,
    `GLIBC_TUNABLES` where it sets a `glibc.malloc` tunable, mimalloc's `MIMALLOC_*`, and
    `LD_PRELOAD` as the file names of the malloc libraries it preloads (jemalloc, tcmalloc,
    mimalloc). Records carry it as `environment.host_malloc`."""
    found = {k: v for k, v in env.items() if k.startswith(("MALLOC_", "MIMALLOC_"))
             or (k == "GLIBC_TUNABLES" and "glibc.malloc." in v)}
    names = (os.path.basename(p) for p in env.get("LD_PRELOAD", "").replace(":", " ").split())
    preloaded = [name for name in names if "malloc" in name]
    if preloaded:
        found["LD_PRELOAD"] = ",".join(preloaded)
    return " ".join(f"{k}={v}" for k, v in sorted(found.items()))


def compile_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` with mimalloc preloaded in place of glibc's malloc, with COMPILE_MALLOC, for the
    processes that compile plans.

    XLA:TPU's compile is allocation-bound on the host: glibc's malloc took 13% of a
    qwen3-0.6b plan's samples. One qwen3-8b seq-4096 plan took 218 s of CPU with glibc's
    malloc, 185 s with mimalloc and 171 s with mimalloc and COMPILE_MALLOC; two qwen3-0.6b
    plans side by side on 2 cores took 78-90 s each instead of 102-106 s. The plan itself is
    the same to the byte (memory analysis and optimized HLO; tests/harness/cell). Without
    the wheel, `env` is returned as it is (the record's host_malloc says which ran)."""
    if not MIMALLOC.exists():
        return dict(env)
    return {**env, **COMPILE_MALLOC,
            "LD_PRELOAD": " ".join(filter(None, (str(MIMALLOC), env.get("LD_PRELOAD"))))}


def for_cells(env: Mapping[str, str], backend: str, *, planning: bool) -> dict[str, str]:
    """The variables cells start with: `env` as it is where it names an allocator of the
    user's; else mimalloc for plan processes (`planning`), HOST_MALLOC on the CPU backend,
    nothing added elsewhere (an accelerator's runtime pools its own memory)."""
    if describe(env):
        return dict(env)
    if planning:
        return compile_env(env)
    if backend == "cpu":
        return {**env, **HOST_MALLOC}
    return dict(env)


def keeps_large_blocks(env: Mapping[str, str]) -> bool:
    """Whether glibc serves every request from the process heap and keeps what is freed there
    (HOST_MALLOC, or the same set as glibc tunables): only then does memory faulted in once
    stay mapped for the next execution to reuse."""
    tunables = env.get("GLIBC_TUNABLES", "").split(":")  # name=value:name=value
    no_mmap = (env.get("MALLOC_MMAP_MAX_") == "0" or "glibc.malloc.mmap_max=0" in tunables)
    return no_mmap and sys.platform.startswith("linux")
