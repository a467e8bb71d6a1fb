"""A step's cost: the model's FLOPs (analytic, the same for every arm) with the FLOP/s and
MFU they give at the measured step time, and the compiled program's FLOPs and bytes
(XLA's cost model, loop-aware: harness.xla.compiled), per step."""

from __future__ import annotations

from collections.abc import Mapping

from harness.measure.devices import PEAK_BF16_FLOPS
from harness.xla import categories
from harness.xla.compiled import compiled_cost
from reports.record import Cost


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
        unavailable={name: c.reason for name, c in compiled.items() if c.reason},
        categories_per_step=categories.per_step(
            {name: c.as_text() for name, c in executables.items()}, calls))
