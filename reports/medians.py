"""One cell's median ms/step over its runs, with a run-level 95% CI: what a report's ms/step
table and the dashboard show of a cell on its own (no comparison, no verdict: those are
`reports.stats`'). scipy.stats.bootstrap's percentile method over the runs' medians;
`median_cis` does many cells at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from reports.stats import CONFIDENCE, RESAMPLES, SEED, Runs, run_median

MIN_RUNS = 3
"""Fewest runs (processes) a side for a run-level CI of one cell's median."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MedianCI:
    """A cell's median over runs and its run-level CI (None below MIN_RUNS runs)."""

    median: float
    """Median of the per-run medians."""
    low: float | None
    high: float | None
    runs: int


def median_ci(runs: Runs, seed: int = SEED) -> MedianCI:
    """Median of the per-run medians with a percentile bootstrap CI over runs."""
    return median_cis([runs], seed)[0]


MEDIAN_CI_BATCH = 64
"""Cells bootstrapped in one array by `median_cis` (bounds its memory: 64 x RESAMPLES x
runs floats)."""


def median_cis(samples: Sequence[Runs], seed: int = SEED) -> list[MedianCI]:
    """`median_ci` of each of many cells at once (a year of nightly runs in seconds): the
    cells of equal run counts go to scipy.stats.bootstrap as one array (its `axis`), in
    batches, with `seed`'s generator each time, so every cell gets the interval its own
    call would (the same draws; tested). Below MIN_RUNS runs no CI."""
    from scipy import stats as scipy_stats

    found: list[MedianCI | None] = [None] * len(samples)
    by_runs: dict[int, list[tuple[int, np.ndarray]]] = {}
    for i, runs in enumerate(samples):
        measured = [r for r in runs if len(r)]
        if not measured:
            raise ValueError("no timing samples on the measured side")
        medians = np.array([run_median(r) for r in measured])
        center, n = float(np.median(medians)), len(medians)
        if n < MIN_RUNS or np.ptp(medians) == 0:
            bound = None if n < MIN_RUNS else center
            found[i] = MedianCI(median=center, low=bound, high=bound, runs=n)
        else:
            by_runs.setdefault(n, []).append((i, medians))
    for n, cells in by_runs.items():
        for start in range(0, len(cells), MEDIAN_CI_BATCH):
            batch = cells[start:start + MEDIAN_CI_BATCH]
            interval = scipy_stats.bootstrap(
                (np.stack([m for _, m in batch]),), np.median, axis=-1,
                confidence_level=CONFIDENCE, n_resamples=RESAMPLES, method="percentile",
                random_state=np.random.default_rng(seed)).confidence_interval
            for k, (i, medians) in enumerate(batch):
                found[i] = MedianCI(median=float(np.median(medians)),
                                    low=float(interval.low[k]), high=float(interval.high[k]),
                                    runs=n)
    return found
