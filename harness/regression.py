"""Regression detection against a history, and the A/B comparison of two sets of runs.

The decision rule (both jobs): compare the per-step samples of the new cell with those of its
comparable baseline by the ratio of medians new/old and its 95% bootstrap CI. Samples are
grouped by run (process) and the bootstrap resamples runs first, then steps inside each run,
so run-to-run variation (memory layout, machine state) widens the interval as it should.
- regression (nightly): ratio >= 1 + threshold AND the CI's lower bound > 1;
- A/B verdict: "slower" if the CI lies above 1 and the ratio is at least 1 + MIN_EFFECT,
  "faster" symmetrically, else "no detectable difference"; the minimum detectable effect is
  the CI's half-width relative to the ratio.
Only records with the same environment (versions, backend, device kind and count, XLA flags,
process count), arm and cell config are ever compared.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np

from harness.environment import COMPARABLE_KEYS
from reports.record import Record

RESAMPLES = 2000
CONFIDENCE = 0.95


def cell_key(record: Record) -> tuple:
    """Records with equal keys measure the same thing in the same environment."""
    env = tuple(json.dumps(getattr(record.environment, k, None), sort_keys=True)
                for k in COMPARABLE_KEYS)
    return (record.arm, record.config_hash, record.run.steps, record.run.warmup, *env)


@dataclasses.dataclass(frozen=True)
class Comparison:
    ratio: float
    """median(new) / median(old): above 1 is slower."""
    low: float
    high: float
    runs_old: int
    runs_new: int

    @property
    def mde(self) -> float:
        return (self.high - self.low) / 2 / self.ratio


def _grouped_median(groups: Sequence[np.ndarray], rng: np.random.Generator) -> float:
    picked = [groups[i] for i in rng.integers(0, len(groups), len(groups))]
    return float(np.median(np.concatenate([rng.choice(g, len(g)) for g in picked])))


def compare(old: Sequence[Sequence[float]], new: Sequence[Sequence[float]], *,
            seed: int = 0) -> Comparison:
    """Ratio of pooled medians new/old with a two-level (runs, then steps) bootstrap CI."""
    old_g = [np.asarray(g, np.float64) for g in old if len(g)]
    new_g = [np.asarray(g, np.float64) for g in new if len(g)]
    if not old_g or not new_g:
        raise ValueError("comparison needs samples on both sides")
    rng = np.random.default_rng(seed)
    ratios = np.array([_grouped_median(new_g, rng) / _grouped_median(old_g, rng)
                       for _ in range(RESAMPLES)])
    tail = (1 - CONFIDENCE) / 2 * 100
    ratio = float(np.median(np.concatenate(new_g)) / np.median(np.concatenate(old_g)))
    return Comparison(ratio, float(np.percentile(ratios, tail)),
                      float(np.percentile(ratios, 100 - tail)), len(old_g), len(new_g))


def is_regression(c: Comparison, threshold: float) -> bool:
    return c.ratio >= 1 + threshold and c.low > 1.0


MIN_EFFECT = 0.05
"""A/B differences smaller than this are reported as no detectable difference even when the
CI excludes 1.00: the same effect-size threshold as the nightly default. With 3 runs a side
the run-level bootstrap is optimistic, and A/A runs on a shared CPU host show run-to-run
shifts of a few percent (machine state, not code)."""


def verdict(c: Comparison, min_effect: float = MIN_EFFECT) -> str:
    if c.low > 1.0 and c.ratio >= 1 + min_effect:
        return "slower"
    if c.high < 1.0 and c.ratio <= 1 - min_effect:
        return "faster"
    return "no detectable difference"


@dataclasses.dataclass
class NightlyRow:
    record: Record
    status: str
    """"regression", "ok", "first run (baseline)", or "failed"."""
    comparison: Comparison | None = None
    history: list[Record] = dataclasses.field(default_factory=list)


def against_history(new: Sequence[Record], history: Sequence[Record], *, threshold: float,
                    baseline_runs: int = 5) -> list[NightlyRow]:
    """Classifies each new record against the last `baseline_runs` comparable runs."""
    rows = []
    for record in new:
        if not record.ok:
            rows.append(NightlyRow(record, "failed"))
            continue
        key = cell_key(record)
        past = [h for h in history if h.ok and h.run_id != record.run_id
                and cell_key(h) == key]
        past.sort(key=lambda h: h.timestamp or "")
        if not past:
            rows.append(NightlyRow(record, "first run (baseline)"))
            continue
        baseline = past[-baseline_runs:]
        c = compare([h.timing.step_ms for h in baseline], [record.timing.step_ms])
        rows.append(NightlyRow(record, "regression" if is_regression(c, threshold) else "ok",
                               c, past))
    return rows
