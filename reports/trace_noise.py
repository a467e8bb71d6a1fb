"""Whether one operation's traced time moved beyond noise between two captures: the trace
explanation's "beyond noise" (harness.measure.trace_diff), judged by the one statistics
rule's process spread and minimum effect (reports.stats)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from reports.stats import default_min_effect, percent, step_noise_bound


def step_noise_rule(backend: str | None = None) -> str:
    """`beyond_step_noise` in words, for a table's legend."""
    where = "on a TPU" if backend == "tpu" else "on the CPU machine"
    return ("every traced step of one side lies outside the other side's range and the "
            "median step moved by more than two whole processes of identical code may "
            f"differ ({step_noise_bound(backend):.3g}x {where}, one capture a side) and by "
            f"{percent(default_min_effect(backend))}+ of the step (the minimum effect "
            f"{where})")


def beyond_step_noise(a: Sequence[float], b: Sequence[float], step: float,
                      backend: str | None = None) -> bool:
    """Whether one op's (or category's) time per traced step moved beyond noise from `a` to
    `b`, two captures of one process each: the per-step ranges are disjoint (A/A noise of
    its own steps), and the median step's ratio clears the process-spread bound of one run
    a side (`stats.step_noise_bound`: the prior of `backend`, where the captures ran) with
    a change of at least the backend's minimum effect (`stats.default_min_effect`) of
    `step` (the step's span: a change that cannot move the step by that much explains no
    verdict).
    Medians: one slow step (a first traced step's cold cache) moves nothing. A side without
    steps is not compared."""
    if not a or not b or min(a) < 0 or min(b) < 0:
        return False
    disjoint = max(a) < min(b) or max(b) < min(a)
    mean_a, mean_b = statistics.median(a), statistics.median(b)
    ratio = max(mean_a, mean_b) / min(mean_a, mean_b) if min(mean_a, mean_b) > 0 else math.inf
    return (disjoint and ratio > step_noise_bound(backend)
            and abs(mean_b - mean_a) >= default_min_effect(backend) * step)
