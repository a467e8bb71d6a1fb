"""The one statistics rule: when is one set of timings faster or slower than another.

Every comparison in the project (the report's speedups, `parity compare`, `parity ab` and
the nightly regression check) goes through `compare` and `verdict` here.

A timing sample is a list of runs (processes), each a list of per-step wall times. Steps of
one process share its memory layout, compilation and machine state, so they scatter less
than processes do: a CI from the steps of one process is too narrow for a claim about the
code. The rule:

- statistic: ratio of pooled medians, median(new) / median(old) (above 1: new is slower);
- its 95% CI: a two-level bootstrap, resampling runs and then steps inside each run (scipy
  has no hierarchical resampler). Runs of two sides that ran as interleaved rounds (round r
  of A next to round r of B) are resampled *paired* (the same round indices on both sides),
  so slow drift of the machine, which moves both sides of a round alike, cancels. With a
  handful of runs a plain percentile interval is too narrow (a resample of n runs has
  sqrt((n-1)/n) of their spread, and the normal quantile ignores that the spread itself is
  estimated from n runs): it misses far more than 5% of the time. So the interval is the
  *expanded* percentile interval (Hesterberg, "What teachers should know about the
  bootstrap", 2015): its tails are those of a normal at sqrt(n/(n-1)) * t(n-1) instead of z,
  n being the fewer runs of the two sides (the pairs, when paired);
- verdict: "slower"/"faster" only when the CI excludes 1.00 and the ratio is at least
  `min_effect` away from 1, with `MIN_STEPS`+ steps per run. With enough runs that the CI
  could reach 95% at all (`luck_bound`: 6+ interleaved pairs, or e.g. 4 + 4 independent
  runs), the CI decides. With fewer, the bootstrap cannot see how far whole processes of
  identical code fall apart, so the CI is widened by the *process-spread bound*
  (`spread_bound`): a log-normal process offset of SD `prior_log_sd` (the CPU machine's
  `PROCESS_LOG_SD`, a TPU's `TPU_PROCESS_LOG_SD`; or the runs' own spread, if larger) on
  each side, at the confidence's normal quantile. An effect beyond the
  widened CI is decided (a tripled step time with one run a side is slower); one inside it
  is "too few samples", never significant. Otherwise "no detectable difference";
- MDE (minimum detectable effect): the CI's half-width relative to the ratio.

`median_ci` gives one cell's median over runs with a run-level CI (scipy.stats.bootstrap's
percentile method; `median_cis` does many cells at once),
and `warnings` flags pyperf-style instability: a run whose steps scatter (CV above
`MAX_CV`) or runs whose medians disagree by more than `MAX_RUN_SPREAD`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Sequence

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 10_000
"""Enough for stable tails: the expanded interval reads percentiles as far out as 0.1%."""
SEED = 0
"""Fixed: the same samples always give the same CI, so a regenerated report is unchanged."""
MIN_EFFECT = 0.05
"""Smallest relative difference that earns a verdict (a CI may exclude 1.00 for a 1% shift
that is machine state rather than code)."""
MIN_RUNS = 3
"""Fewest runs (processes) a side for a run-level CI of one cell's median."""
MIN_PAIRS = 6
"""Fewest interleaved pairs of runs for a paired verdict (2^(1-6) = 3.1% <= 5%)."""
MIN_STEPS = 5
"""Fewest timed steps per run for a verdict."""
PROCESS_LOG_SD = 0.25
"""SD of log(per-process median) between processes of identical code, the bound a verdict
from too few runs must clear. Measured on this project's CI machine type (2-core x86 VM, no
accelerator) with `parity run --arms native --preset small --seq 64 --batch 8 --ga 1 --steps
20 --rounds 10`: 0.04-0.08 on an idle machine, 0.147 in an earlier measurement, 0.22-0.29
where another process shared the machine for part of the run (which `timing.other_load`
now shows). 0.25 is taken: a quieter host (an accelerator) spreads less, so this errs
towards "too few samples", never towards a false verdict. With one run a side the bound is
a factor exp(1.96 x 0.25 x sqrt(2)) = 2.0."""
TPU_PROCESS_LOG_SD = 0.01
"""The same where every run ran on a TPU (record backend `tpu`): the step is the chip's,
shared with no other process. Measured on one TPU v5e (docs/results/tpu-v5e/h2h/*.jsonl,
10 qwen3-0.6b cells each run as 2 processes of identical code, host- and device-bound arms
alike): pooled SD of log(per-process median) 0.00044 over 10 degrees of freedom (95% upper
bound 0.0007, chi-square), the largest pair 0.15% apart. 0.01 is taken, 14x that bound,
for hosts and chips not yet measured: at 2 runs a side exp(1.96 x 0.01) = 1.020, under
`MIN_EFFECT`; the runs' own spread widens it where larger (`spread_bound`)."""
BUSY_PROCESS_LOG_SD = 0.5
"""The same where a run shared the machine with other processes (`Timing.other_load` above
`MAX_OTHER_LOAD`): a contended process ran at up to 2.4x the median of identical code here,
so a busy run's bound is exp(1.96 x 0.5 x sqrt(2)) = 4.0x at one run a side."""
MAX_CV = 0.10
"""Step-time CV above which a run is flagged unstable (pyperf warns at 10% too)."""
MAX_RUN_SPREAD = 0.10
"""(max - min) / median of a cell's run medians above which its runs disagree."""

Runs = Sequence[Sequence[float]]

SLOWER, FASTER, SAME, TOO_FEW = ("slower", "faster", "no detectable difference",
                                 "too few samples")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """median(new) / median(old) with its bootstrap CI and the sample sizes behind it."""

    ratio: float
    """Ratio of pooled medians new/old: above 1 the new side is slower."""
    low: float | None
    """Lower end of the CI; None where it was not computed because no CI could change the
    verdict (`compare(..., min_effect=...)`: a ratio within the minimum effect)."""
    high: float | None
    """Upper end of the CI (None as `low`)."""
    runs_old: int
    runs_new: int
    min_steps: int
    """Fewest steps in any run of either side."""
    paired: bool
    """Runs were resampled as interleaved pairs."""
    spread_bound: float = 1.0
    """The factor by which whole processes of identical code may differ at the confidence
    level, for these run counts (`spread_bound`); it widens the CI where runs are too few."""

    @property
    def mde(self) -> float | None:
        """Half the width of the interval a verdict must clear, relative to the ratio:
        smaller differences are invisible. That interval is the CI, widened by the
        process-spread bound where runs are too few (see `verdict`); None without a CI."""
        if self.low is None or self.high is None:
            return None
        widen = 1.0 if self.enough else self.spread_bound
        return (self.high * widen - self.low / widen) / 2 / self.ratio

    @property
    def enough(self) -> bool:
        """Could these samples reach the confidence at all? See `luck_bound`."""
        return (luck_bound(self.runs_old, self.runs_new, self.paired) <= 1 - CONFIDENCE
                and self.min_steps >= MIN_STEPS)

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "mde": self.mde}


def _runs(runs: Runs, side: str) -> list[np.ndarray]:
    arrays = [np.asarray(r, np.float64) for r in runs if len(r)]
    if not arrays:
        raise ValueError(f"no timing samples on the {side} side")
    return arrays


def _resampled_medians(runs: list[np.ndarray], picks: np.ndarray,
                       rng: np.random.Generator) -> np.ndarray:
    """For each row of `picks` (run indices drawn with replacement): the median of the
    picked runs pooled, each run's steps redrawn with replacement."""
    resamples = len(picks)
    if len({len(r) for r in runs}) == 1:  # equal run lengths: all resamples at once
        steps = np.stack(runs)  # runs x steps
        redrawn = rng.integers(0, steps.shape[1], (resamples, *picks.shape[1:], steps.shape[1]))
        values = steps[picks[..., None], redrawn]  # resamples x picked runs x steps
        return np.median(values.reshape(resamples, -1), axis=1)
    return np.array([np.median(np.concatenate([rng.choice(runs[i], len(runs[i]))
                                               for i in row])) for row in picks])


def compare(old: Runs, new: Runs, *, paired: bool = False, seed: int = SEED,
            resamples: int = RESAMPLES, busy: bool = False, backend: str | None = None,
            min_effect: float | None = None) -> Comparison:
    """median(new)/median(old) with a two-level (runs, then steps) bootstrap CI.

    `paired`: run i of `old` ran next to run i of `new` (interleaved rounds); needs the same
    number of runs on both sides and resamples them together. Too few pairs to ever reach the
    confidence (`luck_bound`) are resampled as independent runs instead, which may. `busy`:
    a run shared the machine with other processes (its process-spread bound is wider);
    `backend`: the one backend every run ran on (`prior_log_sd`).

    `min_effect`: the caller wants only the verdict at this minimum effect, so the bootstrap
    is skipped (`low`/`high` None) where the ratio alone decides it: a ratio less than
    `min_effect` away from 1.00, or a run shorter than `MIN_STEPS`, gets no "slower" or
    "faster" whatever its CI (`verdict`). The verdict is the same as with the CI.
    """
    old_runs, new_runs = _runs(old, "old"), _runs(new, "new")
    if paired and len(old_runs) != len(new_runs):
        raise ValueError(f"paired comparison needs equal runs, got {len(old_runs)} and "
                         f"{len(new_runs)}")
    paired = paired and (luck_bound(len(old_runs), len(new_runs), True) <= 1 - CONFIDENCE)
    ratio = float(np.median(np.concatenate(new_runs)) / np.median(np.concatenate(old_runs)))
    min_steps = min(len(r) for r in [*old_runs, *new_runs])
    if min_effect is not None and (min_steps < MIN_STEPS or 1 - min_effect < ratio
                                   < 1 + min_effect):
        return Comparison(ratio=ratio, low=None, high=None, runs_old=len(old_runs),
                          runs_new=len(new_runs), min_steps=min_steps, paired=paired,
                          spread_bound=spread_bound(old_runs, new_runs, busy=busy,
                                                 backend=backend))
    rng = np.random.default_rng(seed)
    picks_old = rng.integers(0, len(old_runs), (resamples, len(old_runs)))
    picks_new = (picks_old if paired
                 else rng.integers(0, len(new_runs), (resamples, len(new_runs))))
    ratios = (_resampled_medians(new_runs, picks_new, rng)
              / _resampled_medians(old_runs, picks_old, rng))
    tail = expanded_tail(min(len(old_runs), len(new_runs))) * 100
    return Comparison(ratio=ratio, low=float(np.percentile(ratios, tail)),
                      high=float(np.percentile(ratios, 100 - tail)),
                      runs_old=len(old_runs), runs_new=len(new_runs),
                      min_steps=min_steps, paired=paired,
                      spread_bound=spread_bound(old_runs, new_runs, busy=busy,
                                                backend=backend))


def compare_slices(old: Sequence[Sequence[Sequence[float]]],
                   new: Sequence[Sequence[Sequence[float]]], *, seed: int = SEED,
                   resamples: int = RESAMPLES) -> Comparison:
    """median(new)/median(old) of two arms timed in one process in alternating slices
    (in-process pairing), each side given as processes x slices x steps.

    Slice i of process p of both sides ran next to each other, so they are resampled
    together: a three-level paired bootstrap (processes, then the slices inside each, then
    steps inside each slice, the steps drawn apart for each side). The unit of the verdict
    is the slice pair: `runs_old`/`runs_new` count them, so 6+ pairs can reach 95%
    (`luck_bound`) and the interval is expanded for that many. Drawing processes first keeps
    the luck of one process (an arm that happens to sit badly in its memory) inside the CI.
    """
    o, n = np.asarray(old, np.float64), np.asarray(new, np.float64)
    if o.ndim != 3 or o.shape[:2] != n.shape[:2] or not o.size or not n.size:
        raise ValueError(f"slices to compare must be processes x slices x steps of equal "
                         f"processes and slices, got {o.shape} and {n.shape}")
    procs, slices = o.shape[:2]
    rng = np.random.default_rng(seed)
    pick_p = rng.integers(0, procs, (resamples, procs))[:, :, None, None]
    pick_s = rng.integers(0, slices, (resamples, procs, slices))[:, :, :, None]

    def medians(x: np.ndarray) -> np.ndarray:
        steps = rng.integers(0, x.shape[2], (resamples, procs, slices, x.shape[2]))
        return np.median(x[pick_p, pick_s, steps].reshape(resamples, -1), axis=1)

    ratios = medians(n) / medians(o)
    tail = expanded_tail(procs * slices) * 100
    ratio = float(np.median(n) / np.median(o))
    return Comparison(ratio=ratio, low=float(np.percentile(ratios, tail)),
                      high=float(np.percentile(ratios, 100 - tail)),
                      runs_old=procs * slices, runs_new=procs * slices,
                      min_steps=min(o.shape[1] * o.shape[2], n.shape[1] * n.shape[2]),
                      paired=True, spread_bound=spread_bound(
                          [r.ravel() for r in o], [r.ravel() for r in n]))


def spread_bound(old: Sequence[np.ndarray], new: Sequence[np.ndarray],
                 confidence: float = CONFIDENCE, *, busy: bool = False,
                 backend: str | None = None) -> float:
    """exp(z x sd x sqrt(1/a + 1/b)) for a and b runs: how far apart the pooled medians of
    two sides of identical code may fall through process-to-process spread alone. sd is
    `prior_log_sd(busy, backend)`, or the SD of the runs' log medians around their side's
    mean where that is larger (a noisier machine than the one measured)."""
    logs = [np.log([run_median(r) for r in side]) for side in (old, new)]
    deviations = np.concatenate([side - side.mean() for side in logs])
    dof = len(deviations) - 2
    observed = float(np.sqrt((deviations**2).sum() / dof)) if dof > 0 else 0.0
    return _process_bound(max(prior_log_sd(busy, backend), observed), len(old), len(new),
                          confidence)


def _process_bound(sd: float, runs_a: int, runs_b: int, confidence: float) -> float:
    """exp(z x sd x sqrt(1/a + 1/b)): a process offset of log-SD `sd`, a and b runs a side."""
    return float(np.exp(_normal_quantile(confidence) * sd * np.sqrt(1 / runs_a + 1 / runs_b)))


def prior_log_sd(busy: bool = False, backend: str | None = None) -> float:
    """The process-to-process SD a verdict from few runs assumes: `BUSY_PROCESS_LOG_SD`
    where a run shared the machine, `TPU_PROCESS_LOG_SD` where every run ran on a TPU, else
    `PROCESS_LOG_SD` (the CPU machine's; a GPU's is not measured and keeps it)."""
    if busy:
        return BUSY_PROCESS_LOG_SD
    return TPU_PROCESS_LOG_SD if backend == "tpu" else PROCESS_LOG_SD


def one_backend(backends) -> str | None:
    """The backend every record ran on, None where they differ or none is known."""
    found = set(backends)
    return found.pop() if len(found) == 1 else None


@functools.cache
def _normal_quantile(confidence: float) -> float:
    """z of a two-sided interval at `confidence` (1.96 at 95%)."""
    from scipy import stats as scipy_stats

    return float(scipy_stats.norm.ppf(1 - (1 - confidence) / 2))


def luck_bound(runs_old: int, runs_new: int, paired: bool) -> float:
    """The chance that identical code puts every run of one side beyond every run of the
    other by luck alone: 2^(1-n) for n interleaved pairs all on one side, 2 / C(a+b, a) for
    independent runs. No resampling of runs can be more confident than this, so a verdict
    needs it below 1 - CONFIDENCE: 6+ pairs, or independent runs such as 4 + 4 or 3 + 5."""
    if paired:
        return 2.0 ** (1 - runs_old)
    return 2.0 / math.comb(runs_old + runs_new, runs_old)


@functools.cache
def expanded_tail(n: int, confidence: float = CONFIDENCE) -> float:
    """One tail's probability of the expanded percentile interval for n runs: Phi(-z'),
    z' = sqrt(n/(n-1)) * t_{(1+confidence)/2, n-1}; the plain (1-confidence)/2 for n < 2
    (no spread to expand)."""
    from scipy import stats as scipy_stats

    plain = (1 - confidence) / 2
    if n < 2:
        return plain
    z = (n / (n - 1)) ** 0.5 * scipy_stats.t.ppf(1 - plain, n - 1)
    return float(scipy_stats.norm.sf(z))


def verdict(c: Comparison, min_effect: float = MIN_EFFECT) -> str:
    """"slower", "faster", "no detectable difference" or "too few samples" (new vs old).

    Too few runs for the CI to reach the confidence (`luck_bound`): decided only where the
    CI clears the process-spread bound too (`Comparison.spread_bound`), else too few."""
    if c.min_steps < MIN_STEPS:
        return TOO_FEW
    if c.low is None or c.high is None:  # skipped: the ratio is within the minimum effect
        if not 1 - min_effect < c.ratio < 1 + min_effect:
            raise ValueError(f"ratio {c.ratio:.3f} is {min_effect:.0%}+ away from 1.00: its "
                             "verdict needs the CI, which was not computed")
        return SAME if c.enough else TOO_FEW
    low, high = c.low, c.high
    if not c.enough:
        low, high = low / c.spread_bound, high * c.spread_bound
    if low > 1.0 and c.ratio >= 1 + min_effect:
        return SLOWER
    if high < 1.0 and c.ratio <= 1 - min_effect:
        return FASTER
    return SAME if c.enough else TOO_FEW


def step_noise_bound(backend: str | None = None) -> float:
    """The process bound at one capture a side: 2.0x on the CPU machine, 1.028x on a TPU."""
    return _process_bound(prior_log_sd(backend=backend), 1, 1, CONFIDENCE)


def step_noise_rule(backend: str | None = None) -> str:
    """`beyond_step_noise` in words, for a table's legend."""
    where = "on a TPU" if backend == "tpu" else "on the CPU machine"
    return ("every traced step of one side lies outside the other side's range and the "
            "median step moved by more than two whole processes of identical code may "
            f"differ ({step_noise_bound(backend):.3g}x {where}, one capture a side) and by "
            f"{MIN_EFFECT:.0%}+ of the step")


def beyond_step_noise(a: Sequence[float], b: Sequence[float], step: float,
                      backend: str | None = None) -> bool:
    """Whether one op's (or category's) time per traced step moved beyond noise from `a` to
    `b`, two captures of one process each: the per-step ranges are disjoint (A/A noise of
    its own steps), and the median step's ratio clears the process-spread bound of one run
    a side (`step_noise_bound`: the prior of `backend`, where the captures ran) with a
    change of at least `MIN_EFFECT` of `step` (the step's span: a change that cannot move
    the step by that much explains no verdict). Medians: one slow step (a first traced
    step's cold cache) moves nothing. A side without steps is not compared."""
    if not a or not b or min(a) < 0 or min(b) < 0:
        return False
    disjoint = max(a) < min(b) or max(b) < min(a)
    mean_a, mean_b = statistics.median(a), statistics.median(b)
    ratio = max(mean_a, mean_b) / min(mean_a, mean_b) if min(mean_a, mean_b) > 0 else math.inf
    return (disjoint and ratio > step_noise_bound(backend)
            and abs(mean_b - mean_a) >= MIN_EFFECT * step)


def is_regression(c: Comparison, threshold: float) -> bool:
    """A slowdown of at least `threshold` that is beyond noise (the nightly rule)."""
    return verdict(c, threshold) == SLOWER


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
        medians = np.array([run_median(r) for r in _runs(runs, "measured")])
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


def run_median(run: np.ndarray | Sequence[float]) -> float:
    """The median of one run's steps, the value np.median gives (the middle value, or the
    mean of the two middle values), without its overhead: a few dozen samples sort faster
    in Python than numpy sets up a partition."""
    return float(statistics.median(run.tolist() if isinstance(run, np.ndarray) else run))


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
    arrays = _runs(runs, "measured")
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


MAX_STEAL = 0.02
"""Share of CPU time stolen by the hypervisor during a window above which it is flagged."""
MAX_OTHER_LOAD = 0.10
"""Share of the machine's CPU time other processes kept busy during a window above which
it is flagged (measured here: a cell sharing the 2-core VM with one other cell process ran
up to 2x slower)."""
MAX_PROBE_SPREAD = 0.35
"""(max - min) / median of a cell's runs' fastest fixed-work probes above which the
machine's speed is said to have changed between runs. The probe spreads by itself: on an
idle 2-core VM the fastest of a run's 6 probes ranged 8.66-10.77 ms over 10 runs (23%) and
8.63-11.50 ms over 16 (32%), so only more than that is flagged."""


def busy(other_loads: Sequence[float | None]) -> bool:
    """Did any run share the machine with other processes beyond `MAX_OTHER_LOAD`?"""
    return any(x is not None and x > MAX_OTHER_LOAD for x in other_loads)


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
