"""A plan record's sections: XLA's plan of a cell's step for a TPU topology (`Plan`), its
executables, and the step's roofline on the target's datasheet."""

from __future__ import annotations

import dataclasses

from reports.record.decode import record_section as _section

__all__ = ["Bound", "Datasheet", "ExecutablePlan", "Plan", "Roofline"]


@_section
class ExecutablePlan:
    """One executable of a plan: XLA's memory analysis for the target (bytes per device)
    and what one call moves and computes (harness.xla.counts; per device)."""

    calls_per_step: int
    argument: int
    output: int
    alias: int
    temp: int
    peak_memory_in_bytes: int
    """XLA's own peak of the executable's buffer assignment."""
    host_temp: int
    held_bytes: int
    """Train state in HBM while it runs that is not one of its arguments (the optimizer
    moments while a split fwd/bwd runs)."""
    hbm_bytes: float | None
    """Bytes one call reads from and writes to HBM (memory space 0), loops counted."""
    flops: float | None
    """Matmul FLOPs of one call, loops counted."""
    collective_bytes: dict[str, float] | None
    """One call's collective bytes by kind: what each device sends under ring algorithms
    (harness.xla.counts), loops counted."""
    trip_counts: list[int]
    unavailable: str | None = None
    """Why hbm_bytes, flops and collective_bytes are None (a loop of unreadable length)."""
    compile_s: float = 0.0
    """Seconds XLA:TPU took to compile it here (0 when read from the plan cache)."""
    hlo_stage_s: float | None = None
    """Of `compile_s`, the seconds until XLA wrote its buffer assignment: the HLO passes,
    where every figure of the plan is fixed; the rest is code generation for the target.
    None when read from the plan cache (or from a record written before it was kept)."""
    cached: bool = False
    """Read back from the plan cache: the same program, compiler and target planned
    before (harness.cell.plan)."""
    peak_buffers: list[dict] = dataclasses.field(default_factory=list)
    """The buffers XLA's buffer assignment has live at the executable's peak, grouped by
    defining category and shape, the largest first: {defined_by, shape, count, bytes}
    (harness.xla.peak). Their bytes sum to XLA's own live peak; the planned total
    (argument + output + temp - alias) is that or more."""
    peak_unavailable: str | None = None
    """Why `peak_buffers` is empty (no live-range dump, or its two counts disagreed)."""


@_section
class Datasheet:
    """What one device of the target's kind can do at most, from its vendor's datasheet, per
    JAX device (harness.measure.devices), with where each figure comes from."""

    device_kind: str
    matmul_dtype: str
    """The dtype the step's matmuls run in (the cell's compute dtype)."""
    peak_flops: float
    """Dense peak FLOP/s of one device for matmuls in `matmul_dtype`."""
    peak_flops_source: str
    hbm_bytes_per_s: float
    interconnect_bytes_per_s: float | None
    """The device's share of its chip's bidirectional interconnect bandwidth (ICI on a TPU,
    NVLink or Infinity Fabric on a GPU); None where the datasheet gives none."""
    source: str


@_section
class Bound:
    """The least time one call (or a whole step) can take on the target's device, from the
    compiler's figures against the datasheet: not a measurement."""

    compute_s: float | None
    """Matmul FLOPs / peak FLOP/s."""
    memory_s: float | None
    """HBM bytes / HBM bandwidth."""
    collective_s: dict[str, float] | None
    """Per kind: the bytes each device sends (ring algorithms) / interconnect bandwidth."""
    lower_bound_s: float | None
    """max(compute, memory, the collectives' sum) per call; a step's: the sum over its
    executables of calls x their call's bound (executables run one after another)."""
    bound_by: str | None
    """compute, memory or collectives: what sets lower_bound_s (a step: the one that sets
    the most of its sum)."""


@_section
class Roofline:
    """A plan's least step time on the target (harness.measure.roofline): the compiler's
    FLOPs, HBM bytes and collective bytes against the device's datasheet. Not a
    measurement: the time no schedule of this program could beat on that device."""

    datasheet: Datasheet
    executables: dict[str, Bound]
    """Per executable, one call."""
    step: Bound
    model_compute_s: float
    """The step's model FLOPs per device at peak: the time a perfect program would take."""
    mfu_ceiling: float | None
    """model_compute_s / step.lower_bound_s: the MFU this program cannot exceed."""
    model: str
    """How the bound is built, in words (what overlaps, which bandwidth a collective uses)."""


@_section
class Plan:
    """XLA's plan of the cell's step for a TPU topology, compiled without its hardware: the
    compiler's static buffer assignment and cost model, an upper bound on peak HBM, never a
    measurement. Exact: the same code and versions give the same figures."""

    target: str
    slices: int
    device_kind: str
    device_count: int
    libtpu: str | None
    mesh: dict[str, int]
    """The cell's mesh axes on the target."""
    hbm_capacity_bytes: int | None
    """HBM one device may use, as XLA:TPU states it (harness.xla.target.available_hbm)."""
    executables: dict[str, ExecutablePlan]
    resident_bytes: dict[str, int]
    """Train state the trainer holds in HBM between executables, per device, by part
    (params, opt_state, accumulator, rest)."""
    planned_peak_bytes: int
    """Max over the executables a step runs of argument + output + temp - alias + held."""
    peak_executable: str
    xla_peak_bytes: int
    """Max over the same executables of XLA's peak_memory_in_bytes + held."""
    hbm_bytes_per_step: float | None
    flops_per_step: float | None
    """Matmul FLOPs per step per device (remat recompute included)."""
    model_flops_per_step: float
    """The analytic model FLOPs of the step's tokens (all devices; harness.measure.flops)."""
    collective_bytes_per_step: dict[str, float] | None
    fits: bool | None
    """planned_peak_bytes <= hbm_capacity_bytes (None: capacity unknown)."""
    compile_s: float
    """Seconds spent compiling the executables here (those read from the plan cache: 0)."""
    host_peak_rss_bytes: int | None
    """The plan process's peak resident memory on the host."""
    hlo_dir: str | None = None
    """Where each executable's optimized HLO text was written (`parity plan --save-hlo`)."""
    categories_per_step: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """The step by operation category (harness.xla.categories): per category, instruction
    runs, FLOPs, HBM bytes and collective bytes per device, every executable x its calls
    per step, loops counted as they run; what `parity explain` compares."""
    libtpu_build: str | None = None
    """The compiler build that made the plan, as its client names itself (libtpu's
    platform version: build date and changelist)."""
    roofline: Roofline | None = None
    """The plan's least step time on the target; None where the device kind has no
    datasheet (harness.measure.devices) or a figure is unavailable."""
