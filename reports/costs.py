"""Noise-free cost metrics of a cell and their exact comparison.

Compiled FLOPs and bytes accessed per optimizer step, the planned peak memory, executions
per step and the compile count are properties of the compiled program, not of the machine's
mood: the same code in the same environment gives the same numbers in every process. So they
are compared exactly, and any change is reported with its old and new values, whatever the
timings say. On a noisy CPU runner this is the signal that catches a regression (an extra
param-sized copy, a second compile, one more executable per step) that the timings cannot.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from reports.record import Record

METRICS: dict[str, tuple[str, Callable[[Record], float | None]]] = {
    "compiled_flops_per_step": ("FLOP", lambda r: r.cost and r.cost.compiled_flops_per_step),
    "bytes_accessed_per_step": ("B", lambda r: r.cost and r.cost.bytes_accessed_per_step),
    "planned_peak_bytes": ("B", lambda r: r.memory and r.memory.planned_bytes),
    "executions_per_step": ("", lambda r: r.timing and r.timing.executions_per_step),
    "compiles": ("", lambda r: r.timing and r.timing.compiles),
    # A plan's figures for its target (harness.cell.plan): per device, exact for given versions.
    "plan_peak_bytes": ("B", lambda r: r.plan and r.plan.planned_peak_bytes),
    "plan_resident_bytes": ("B", lambda r: r.plan and sum(r.plan.resident_bytes.values())),
    "plan_hbm_bytes_per_step": ("B", lambda r: r.plan and r.plan.hbm_bytes_per_step),
    "plan_flops_per_step": ("FLOP", lambda r: r.plan and r.plan.flops_per_step),
    "plan_collective_bytes_per_step": (
        "B", lambda r: r.plan and r.plan.collective_bytes_per_step
        and sum(r.plan.collective_bytes_per_step.values())),
    **{f"plan_{kind.replace('-', '_')}_bytes_per_step": (
        "B", lambda r, kind=kind: r.plan and r.plan.collective_bytes_per_step
        and r.plan.collective_bytes_per_step.get(kind))
       for kind in ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
                    "collective-permute")},
}
"""name -> (unit, how to read it from a record). Every metric is 'lower is better'."""


def values(record: Record) -> dict[str, float | None]:
    """The cost metrics of one record (None where the record has no such number)."""
    return {name: read(record) for name, (_, read) in METRICS.items()}


def _seen_all(records: Sequence[Record]) -> dict[str, set[float]]:
    """Every metric's distinct values over the ok records (each record read once)."""
    rows = [values(r) for r in records if r.ok]
    return {name: {row[name] for row in rows if row[name] is not None} for name in METRICS}


def side_values(records: Sequence[Record]) -> dict[str, float | None]:
    """Every cost metric of one side's records, as `changes` compares them (the largest
    where its runs disagree; None where no record has it)."""
    return {name: max(seen, default=None) for name, seen in _seen_all(records).items()}


def nondeterministic(records: Sequence[Record]) -> list[str]:
    """Warnings for metrics whose runs of one cell disagree (then they are not noise-free)."""
    return [f"{name} differs between runs of this cell: {sorted(seen)}"
            for name, seen in _seen_all(records).items() if len(seen) > 1]


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostChange:
    """One cost metric that differs between two sides."""

    metric: str
    old: float | None
    new: float | None

    @property
    def relative(self) -> float | None:
        """(new - old) / old; None when either side is missing or old is 0."""
        if self.old is None or self.new is None or not self.old:
            return None
        return (self.new - self.old) / self.old

    @property
    def increase(self) -> bool:
        return self.old is not None and self.new is not None and self.new > self.old

    def text(self) -> str:
        unit = METRICS[self.metric][0]
        rel = f" ({self.relative:+.1%})" if self.relative is not None else ""
        return f"{self.metric}: {_fmt(self.old, unit)} -> {_fmt(self.new, unit)}{rel}"

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "relative": self.relative}


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "B":
        return f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value:.0f} B"
    if unit == "FLOP":
        return f"{value / 1e9:.4g} GFLOP"
    return f"{value:g}"


def changes(old: Sequence[Record], new: Sequence[Record]) -> list[CostChange]:
    """Every cost metric whose value differs between the two sides (exact comparison).

    A metric missing on one side only (e.g. an older record without it) is a change too, so
    a cost metric can never disappear unnoticed; missing on both sides is not.
    """
    before, after = side_values(old), side_values(new)
    return [CostChange(metric=name, old=before[name], new=after[name]) for name in METRICS
            if before[name] != after[name]]


def increases(found: Sequence[CostChange], threshold: float = 0.0) -> list[CostChange]:
    """The changes that are a cost increase beyond `threshold` (relative)."""
    return [c for c in found if c.increase and (c.relative is None or c.relative > threshold)]
