"""`parity plan`: every cell of a grid compiled for a TPU topology (nothing runs), one
process per cell, side by side where the host has the cores and memory."""

from __future__ import annotations

import os
from pathlib import Path

from harness.grid import options as grid_options
from harness.jobs import run as run_job
from harness.jobs.grid import Grid, Request, Watch, quiet
from harness.jobs.grid import check as check_grid
from harness.store import results
from harness.store.layout import OutDir
from harness.xla import target as tpu
from reports.record import Record

TIMEOUT_S = 1800
"""A cell's default limit: XLA:TPU compiles a split engine's three kernels of a qwen3-8b
step in 10+ minutes on 2 cores (a run's default, 600 s, is for running cells)."""

PLAN_PROCESS_BYTES = 8 * 2**30
"""Host memory one plan process may take: a qwen3-8b seq-1024 cell peaked at 1.0-1.2 GiB RSS
here, and `parity plan` is held to <= 8 GiB per process."""

COMPILE_CORES = 2
"""Cores one XLA:TPU compile keeps busy: libtpu 0.0.52 lowers a program's fusions to LLO on a
thread per core (38 of the 53 s of a qwen3-8b seq-4096 step's compile), and the nightly's 24
plans, one at a time on 2 cores, used 1.77 cores on average. Two side by side only contend:
the same 24 plans took 2,997 CPU-seconds two at a time against 2,267 one at a time (26:45
against 22:03 wall)."""


def default_jobs() -> int:
    """Plans side by side by default: one per `COMPILE_CORES` cores, as many as host memory
    holds at `PLAN_PROCESS_BYTES` each (1 on a 2-core 24 GiB machine), at least 1."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    cores = os.cpu_count() or 1
    return max(1, min(cores // COMPILE_CORES, memory // PLAN_PROCESS_BYTES))


def check(request: Request, *, jobs: int | None, save_hlo: bool,
          allow_dirty: bool = False) -> dict:
    """The plan's grid options, every value checked that needs no device (`allow_dirty`: as
    harness.jobs.grid.check's)."""
    rounds = request.explicit.get("rounds")
    if rounds not in (None, 1):
        raise ValueError(f"--rounds {rounds}: a plan is deterministic (the same code and "
                         "versions give the same figures); plan once")
    options = check_grid(request, defaults={"trace": False, "timeout_s": TIMEOUT_S},
                         allow_dirty=allow_dirty)
    options["rounds"] = 1  # a suite's rounds are for timing
    grid_options.check_jobs(jobs)
    if save_hlo:
        results.check_writable(OutDir(request.out).hlo, "--save-hlo: the HLO directory")
    return options


def describe_target(options: dict, out: Path, *, name: str | None = None,
                    slices: int | None = None, save_hlo: bool = False,
                    cache: bool = True) -> dict:
    """The target the cells are planned for (harness.xla.target.probe: libtpu loaded in a
    process of its own), as the grid needs it: the topology named, else the suite's, else
    TPU7X; the plan cache under `out`; whether each executable's HLO is saved."""
    name = name or options.get("target") or tpu.TPU7X
    slices = slices if slices is not None else options.get("target_slices") or 1
    described = tpu.probe(name, slices)
    described["save_hlo"] = save_hlo
    if cache:
        described["plan_cache"] = str(OutDir(out).plan_cache.absolute())
    return described


def plan(request: Request, options: dict, target: dict, *, run_id: str | None = None,
         jobs: int | None = None, watch: Watch = quiet) -> tuple[Path, list[Record]]:
    """`parity plan`: (results path, records) of every cell of `options` planned for
    `target` (`describe_target`), `jobs` at a time (default `default_jobs`), each process
    allowed to load libtpu beside the others."""
    grid = Grid(request, options, run_id=run_id, target=target)
    jobs = jobs if jobs is not None else default_jobs()
    env = {**grid.env, tpu.MULTIPLE_LOAD_ENV: "1"} if jobs > 1 else grid.env
    with watch(grid, len(grid.cells) + len(grid.unrun) - grid.recorded()) as (on_start,
                                                                               on_record):
        return run_job.run_cells(grid, jobs=jobs, env=env, on_start=on_start,
                                 on_record=on_record)


def failing(records: list[Record]) -> list[str]:
    """'<cell>: <why>' for every cell that did not plan or does not fit its target."""
    from reports.record import cell_name

    return [f"{cell_name(r.arm, r.spec)}: "
            + (f"{r.error.reason}: {r.error.message[:300]}" if not r.ok else
               f"planned peak {r.plan.planned_peak_bytes / 2**30:.2f} GiB > "
               f"{r.plan.hbm_capacity_bytes / 2**30:.2f} GiB available")
            for r in records if (not r.ok and not r.unavailable)
            or (r.ok and r.plan.fits is False)]
