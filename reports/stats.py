"""Statistics on per-step samples: the bootstrap CI of a ratio of medians."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

BOOTSTRAP = 2000
SEED = 0


@dataclasses.dataclass(frozen=True)
class RatioCI:
    """median(b) / median(a) with a bootstrap confidence interval."""

    ratio: float
    low: float
    high: float
    confidence: float

    @property
    def excludes_one(self) -> bool:
        return self.low > 1.0 or self.high < 1.0


def ratio_of_medians(a: Sequence[float], b: Sequence[float], *, confidence: float = 0.95,
                     resamples: int = BOOTSTRAP, seed: int = SEED) -> RatioCI:
    """median(b)/median(a) and a percentile bootstrap CI (each sample resampled on its own).

    Deterministic for a given seed, so a report regenerated from the same results is the
    same report.
    """
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if len(a64) < 2 or len(b64) < 2:
        raise ValueError("a ratio CI needs at least 2 samples on each side")
    rng = np.random.default_rng(seed)
    med_a = np.median(rng.choice(a64, (resamples, len(a64))), axis=1)
    med_b = np.median(rng.choice(b64, (resamples, len(b64))), axis=1)
    ratios = med_b / med_a
    tail = (1.0 - confidence) / 2 * 100
    return RatioCI(float(np.median(b64) / np.median(a64)), float(np.percentile(ratios, tail)),
                   float(np.percentile(ratios, 100 - tail)), confidence)
