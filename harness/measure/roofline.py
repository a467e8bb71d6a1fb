"""A plan's least step time on its target: the compiler's figures against the datasheet.

For one call of an executable, per device (the figures `harness.xla.counts` reads from the
optimized HLO, loops counted as they run):

    compute    = matmul FLOPs / the peak FLOP/s of matmuls in the cell's dtype
    memory     = HBM bytes / HBM bandwidth
    collective = per kind, the bytes the device sends under ring algorithms / the device's
                 share of its chip's bidirectional interconnect bandwidth
    bound      = max(compute, memory, sum of the collectives)

The max, not a sum: a schedule may overlap the matrix units, HBM traffic and the
interconnect's DMAs entirely, and no schedule can finish before the busiest of the three
has done its work. So the bound is a time no program of these figures can beat on that
device; a real step adds what does not overlap. Collectives share the chip's links, so
their kinds add. The interconnect figure is the chip's total over all its links in both
directions, shared by its devices: the most the links can carry, so a collective's time is
never overstated (a ring's hop between the two devices of one TPU7x chip uses no ICI link,
and every other hop loads one direction of one link). Multi-slice traffic over the data
center network is counted as if it were ICI (optimistic too).

A step runs its executables one after another: its bound is the sum over executables of
calls per step x the call's bound, and `bound_by` is the resource that sets the most of that
sum. The MFU ceiling is the model FLOPs of the step per device at peak over the step's
bound: the MFU a measurement of this program on that device cannot exceed.
"""

from __future__ import annotations

import math

from harness.measure.devices import DEVICES
from reports.record import Bound, Datasheet, Plan, Roofline

COMPUTE, MEMORY, COLLECTIVES = "compute", "memory", "collectives"

MODEL = ("per call: max(FLOPs / peak, HBM bytes / HBM bandwidth, collective bytes / "
         "interconnect bandwidth), the three overlapping at best; a step: calls x that, "
         "summed over its executables; collectives: the bytes a device sends under ring "
         "algorithms over its share of the chip's bidirectional interconnect (all links, "
         "both ways: optimistic)")


def datasheet(device_kind: str, dtype: str) -> Datasheet | None:
    """The target device's datasheet figures for matmuls in `dtype`; None where the kind or
    its peak for that dtype is not on a datasheet (harness.measure.devices)."""
    spec = DEVICES.get(device_kind)
    peak = spec and spec.matmul_flops(dtype)
    if not peak:
        return None
    return Datasheet(device_kind=device_kind, matmul_dtype=dtype, peak_flops=peak,
                     peak_flops_source=f"{dtype} matmul peak of {device_kind}",
                     hbm_bytes_per_s=spec.hbm_bytes_per_s,
                     interconnect_bytes_per_s=spec.interconnect_bytes_per_s,
                     source=spec.source)


def bound(sheet: Datasheet, *, flops: float | None, hbm_bytes: float | None,
          collective_bytes: dict[str, float] | None) -> Bound:
    """The least time of one call whose compiler figures are these (None: unknown)."""
    compute = None if flops is None else flops / sheet.peak_flops
    memory = None if hbm_bytes is None else hbm_bytes / sheet.hbm_bytes_per_s
    collective = None
    if collective_bytes is not None and (sheet.interconnect_bytes_per_s
                                         or not any(collective_bytes.values())):
        rate = sheet.interconnect_bytes_per_s or math.inf
        collective = {kind: sent / rate for kind, sent in collective_bytes.items()}
    if compute is None or memory is None or collective is None:
        return Bound(compute_s=compute, memory_s=memory, collective_s=collective,
                     lower_bound_s=None, bound_by=None)
    times = {COMPUTE: compute, MEMORY: memory, COLLECTIVES: sum(collective.values())}
    by = max(times, key=times.get)
    return Bound(compute_s=compute, memory_s=memory, collective_s=collective,
                 lower_bound_s=times[by], bound_by=by)


def _step(calls: dict[str, int], calls_bound: dict[str, Bound]) -> Bound:
    """A step's bound: calls x each executable's call, summed (one after another)."""
    running = {name: b for name, b in calls_bound.items() if calls.get(name)}
    if not running or any(b.lower_bound_s is None for b in running.values()):
        return Bound(compute_s=None, memory_s=None, collective_s=None, lower_bound_s=None,
                     bound_by=None)
    kinds = dict.fromkeys(k for b in running.values() for k in b.collective_s)
    share = dict.fromkeys((COMPUTE, MEMORY, COLLECTIVES), 0.0)
    for name, b in running.items():
        share[b.bound_by] += calls[name] * b.lower_bound_s
    return Bound(
        compute_s=sum(calls[n] * b.compute_s for n, b in running.items()),
        memory_s=sum(calls[n] * b.memory_s for n, b in running.items()),
        collective_s={k: sum(calls[n] * b.collective_s.get(k, 0.0)
                             for n, b in running.items()) for k in kinds},
        lower_bound_s=sum(share.values()), bound_by=max(share, key=share.get))


def roofline(plan: Plan, dtype: str) -> Roofline | None:
    """The plan's roofline for matmuls in `dtype` (the cell's compute dtype); None where the
    target's device kind has no datasheet."""
    sheet = datasheet(plan.device_kind, dtype)
    if sheet is None:
        return None
    calls = {name: e.calls_per_step for name, e in plan.executables.items()}
    per_call = {name: bound(sheet, flops=e.flops, hbm_bytes=e.hbm_bytes,
                            collective_bytes=e.collective_bytes)
                for name, e in plan.executables.items()}
    step = _step(calls, per_call)
    devices = math.prod(plan.mesh.values()) if plan.mesh else plan.device_count
    model_s = plan.model_flops_per_step / devices / sheet.peak_flops
    return Roofline(datasheet=sheet, executables=per_call, step=step, model_compute_s=model_s,
                    mfu_ceiling=(model_s / step.lower_bound_s if step.lower_bound_s else None),
                    model=MODEL)
