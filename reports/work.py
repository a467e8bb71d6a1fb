"""Same work or not, by the compiler's own count: compiled FLOPs per model FLOP.

Model FLOPs are one formula for every arm given the same cell (6 x matmul params x tokens +
causal attention, recomputation excluded), so they say what work the cell asks for. XLA's
compiled FLOPs (loop-aware, per device) say what the program really computes: a decoder that
rematerializes its layers recomputes their forward in the backward pass, one that computes
something extra (a second gradient norm, an unused loss) pays for it. Arms of one shape whose
ratios differ by more than `WORK_TOLERANCE` do different work, and their times are not a
comparison of trainers: the same treatment as a gradient-parity FAIL (reports.parity).

Like reports.parity, this module imports nothing but `reports.record`, so the harness can
judge a cell the moment it finishes.
"""

from __future__ import annotations

import math

from reports.record import Record

WORK_TOLERANCE = 0.05
"""Largest relative difference of two arms' compiled/model FLOPs that still counts as the same
work. The arms on one decoder agree to within a few per mille (the optimizer, the gradient
clip and the loss's reductions are a small, trainer-dependent part of the step); a layer's
forward recomputed in the backward pass adds about a third of the step (measured 1.25 vs 1.04
on `small`): 5% lies between the two."""


def flops_per_model_flop(compiled: float | None, model: float | None,
                         device_count: int | None) -> float | None:
    """compiled FLOPs per step x devices / model FLOPs per step; None where either is
    unknown (a loop of unknown length, an old record)."""
    if not compiled or not model or not device_count:
        return None
    if not (math.isfinite(compiled) and math.isfinite(model)):
        return None
    return compiled * device_count / model


def record_ratio(record: Record) -> float | None:
    """`flops_per_model_flop` of one record."""
    cost, env = record.cost, record.environment
    if cost is None:
        return None
    return flops_per_model_flop(cost.compiled_flops_per_step, cost.model_flops_per_step,
                                env.device_count if env else None)


def different_work(mine: float | None, theirs: float | None) -> str:
    """'different work (compiled/model FLOPs 1.25 vs 1.04)' when the ratios differ by more
    than WORK_TOLERANCE; '' when they agree or either is unknown."""
    if mine is None or theirs is None:
        return ""
    if abs(mine - theirs) <= WORK_TOLERANCE * min(mine, theirs):
        return ""
    return f"different work (compiled/model FLOPs {mine:.2f} vs {theirs:.2f})"
