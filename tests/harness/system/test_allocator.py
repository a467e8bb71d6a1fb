"""The host allocator cells run on (harness.system.allocator): chosen by what the cells do,
recorded, and what it changes in a timed CPU step."""

import json
import os
import platform
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from harness.orchestrator.environment import cell_environment
from harness.system.allocator import HOST_MALLOC, describe
from tests.harness.cli_helpers import cli_env

REPO = Path(__file__).resolve().parents[3]


def _installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def test_env_prints_the_environment():
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "env"], env=cli_env(),
                          capture_output=True, text=True, timeout=120)
    env = json.loads(proc.stdout)
    assert env["backend"] == "cpu" and env["versions"]["jax"] == version("jax")
    assert env["versions"]["flax"] == version("flax")
    assert env["versions"]["maxtext"] == _installed("maxtext")  # None where absent (Python 3.11)
    assert env["python"] == platform.python_version()
    assert len(env["git_sha"]) == 40
    assert env["host_malloc"] == describe(HOST_MALLOC)
    # A user's own glibc settings are kept as they are, and are what is recorded.
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "env"],
                          env={**cli_env(), "MALLOC_ARENA_MAX": "4"}, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(proc.stdout)["host_malloc"] == "MALLOC_ARENA_MAX=4"
    assert describe({"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}) == ""
    assert describe({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1", "HOME": "/"}) == (
        "GLIBC_TUNABLES=glibc.malloc.hugetlb=1")
    # A preloaded malloc is an allocator setting; another preloaded library is not.
    assert describe({"LD_PRELOAD": "/x/libjemalloc.so.2:/y/libfoo.so"}) == (
        "LD_PRELOAD=libjemalloc.so.2")
    assert describe({"LD_PRELOAD": "/y/libfoo.so"}) == ""

def test_plan_cells_get_mimalloc_and_timed_cpu_cells_host_malloc():
    """harness.orchestrator.environment.cell_environment picks the allocator by what the
    cells do, and records the one it picked."""
    from harness.system.allocator import compile_env

    env, environment = cell_environment(None, planning=True)
    assert environment["host_malloc"] == describe(env) == describe(compile_env({}))
    env, environment = cell_environment(None)
    assert environment["host_malloc"] == describe(env) == describe(HOST_MALLOC)

def test_plan_processes_run_on_mimalloc():
    """compile_env's preload takes effect: the process maps mimalloc before it loads
    anything, and the process's `malloc` is mimalloc's."""
    from harness.system.allocator import MIMALLOC, compile_env

    env = compile_env(cli_env())
    assert describe(env) == (
        "LD_PRELOAD=libmimalloc.so.3 MIMALLOC_ARENA_EAGER_COMMIT=1 MIMALLOC_PURGE_DELAY=-1")
    probe = ("import ctypes; libc = ctypes.CDLL(None); "
             f"print(open('/proc/self/maps').read().count({MIMALLOC.name!r}) > 0, "
             "ctypes.cast(libc.malloc, ctypes.c_void_p).value == "
             f"ctypes.cast(ctypes.CDLL({str(MIMALLOC)!r}).malloc, ctypes.c_void_p).value)")
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["True", "True"]
    out = subprocess.run([sys.executable, "-c", probe], env=cli_env(), capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert out == ["False", "False"]  # without it: not mapped until the probe loads it


_STEP_FAULTS = """
import json, resource, jax
from arms.registry import make_arm
from arms.spec import CellSpec
from harness.measure.memory import executable_memory
spec = CellSpec.from_dict(dict(preset="tiny", seq=256, batch=32, ga=4))
arm = make_arm("engine", spec)
arm.build()
batches = arm.place(spec.micro_batches(0))
faults = []
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    jax.block_until_ready(arm.step(batches))
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
temp = executable_memory(arm.executables()["fwd_bwd_accumulate"]).temp
print(json.dumps([temp, faults[3:]]))
"""


@pytest.mark.slow  # cell processes under two allocators (~25 s)
def test_cpu_cells_keep_freed_temp_memory_so_a_step_faults_no_pages_in():
    """Counts, in units of one temp buffer, the pages a steady-state step faults in. Under
    glibc's defaults each of the step's 4 executions faults its temp in again: 3.997 temps a
    step, an execution need not touch every page of its temp, so the bound is 3.9. Under
    HOST_MALLOC none does: the median over 6 steps is under half a temp. Half a temp is
    the boundary between 0 and 1 executions re-faulting; the pages left under it are faults
    the kernel takes for its own reasons (0-9 a step on a quiet machine, 2114, 0.11 of a temp,
    on a CI machine), which no allocator setting removes."""

    def faults(env):
        proc = subprocess.run([sys.executable, "-c", _STEP_FAULTS], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        temp, per_step = json.loads(proc.stdout.splitlines()[-1])
        return temp // os.sysconf("SC_PAGE_SIZE"), sorted(per_step)

    pages, default = faults(cli_env())
    assert pages * os.sysconf("SC_PAGE_SIZE") > 32 * 2**20  # above glibc's mmap threshold
    assert default[0] > 3.9 * pages, (pages, default)
    _, pooled = faults({**cli_env(), **HOST_MALLOC})
    assert pooled[len(pooled) // 2] < pages / 2, (pages, pooled)
