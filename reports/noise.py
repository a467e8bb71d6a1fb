"""What a cell's runs say about the machine they ran on: instability and machine warnings.

Nothing here decides a verdict (`reports.stats` does); these lines are printed beside one, so
a reader knows when the runs behind it scattered or shared the machine. `warnings` flags
pyperf-style instability: a run whose steps scatter (CV above `MAX_CV`) or runs whose medians
disagree by more than `MAX_RUN_SPREAD`. `machine_warnings` reads what no arm's code changes:
other processes' load, hypervisor steal and a fixed piece of host work timed around every
window (harness.measure.timing.probe_ms).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reports.stats import MAX_OTHER_LOAD, Runs, run_median

MAX_CV = 0.10
"""Step-time CV above which a run is flagged unstable (pyperf warns at 10% too)."""
MAX_RUN_SPREAD = 0.10
"""(max - min) / median of a cell's run medians above which its runs disagree."""
MAX_STEAL = 0.02
"""Share of CPU time stolen by the hypervisor during a window above which it is flagged."""
MAX_PROBE_SPREAD = 0.35
"""(max - min) / median of a cell's runs' fastest fixed-work probes above which the
machine's speed is said to have changed between runs. The probe spreads by itself: on an
idle 2-core VM the fastest of a run's 6 probes ranged 8.66-10.77 ms over 10 runs (23%) and
8.63-11.50 ms over 16 (32%), so only more than that is flagged."""


def cv(samples: Sequence[float]) -> float:
    """Sample standard deviation / mean (0 for fewer than 2 samples)."""
    array = np.asarray(samples, np.float64)
    if len(array) < 2 or not array.mean():
        return 0.0
    return float(array.std(ddof=1) / array.mean())


def _worst_cv(arrays: list[np.ndarray]) -> float:
    """max(cv(r) for r in arrays); runs of equal length at once, as one array (row by row
    the same sums as one run alone: the same value)."""
    if len(arrays) > 1 and len({len(r) for r in arrays}) == 1 and len(arrays[0]) > 1:
        steps = np.stack(arrays)
        means = steps.mean(axis=1)
        if means.all():
            return float((steps.std(axis=1, ddof=1) / means).max())
    return max(cv(r) for r in arrays)


def warnings(runs: Runs) -> list[str]:
    """Instability warnings for one cell's runs (empty when stable)."""
    found = []
    arrays = [np.asarray(r, np.float64) for r in runs if len(r)]
    if not arrays:
        raise ValueError("no timing samples on the measured side")
    worst = _worst_cv(arrays)
    if worst > MAX_CV:
        found.append(f"unstable steps: CV {worst:.0%} > {MAX_CV:.0%} in a run")
    medians = np.array([run_median(r) for r in arrays])
    if len(medians) > 1:
        spread = float(np.ptp(medians) / np.median(medians))
        if spread > MAX_RUN_SPREAD:
            found.append(f"runs disagree: medians {medians.min():.3g}-{medians.max():.3g} ms "
                         f"({spread:.0%} spread > {MAX_RUN_SPREAD:.0%})")
    return found


def machine_warnings(probes: Sequence[Sequence[float]], steals: Sequence[float | None],
                     other_loads: Sequence[float | None] = ()) -> list[str]:
    """'The machine was noisy' warnings for one cell's runs, from readings no arm's code can
    change: other processes busy for more than `MAX_OTHER_LOAD` of the machine's CPU during
    a run; hypervisor steal above `MAX_STEAL`; and the fixed-work probe
    (harness.measure.timing.probe_ms), whose fastest reading of each run disagrees across runs by
    more than `MAX_PROBE_SPREAD` when the machine's speed changed between them."""
    found = []
    busiest = max((x for x in other_loads if x is not None), default=None)
    if busiest is not None and busiest > MAX_OTHER_LOAD:
        found.append(f"machine busy: other processes used {busiest:.0%} of its CPU during "
                     "a run")
    stolen = max((x for x in steals if x is not None), default=None)
    if stolen is not None and stolen > MAX_STEAL:
        found.append(f"machine noisy: the hypervisor took {stolen:.1%} of CPU time during "
                     "a run (steal)")
    fastest = np.array([min(p) for p in probes if len(p)])
    if len(fastest) > 1:
        spread = float(np.ptp(fastest) / np.median(fastest))
        if spread > MAX_PROBE_SPREAD:
            found.append(f"machine noisy: the fixed-work probe's best took "
                         f"{fastest.min():.2f}-{fastest.max():.2f} ms across runs "
                         f"({spread:.0%} spread)")
    return found
