"""The one statistics rule: when is one set of timings faster or slower than another.

Every comparison in the project (the report's speedups, `parity compare`, `parity ab`,
`parity bisect`, the nightly regression check and the dashboard) goes through `compare` and
`verdict` here, and prints `label`.

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
  the minimum effect away from 1, with `MIN_STEPS`+ steps per run. The minimum effect is the
  backend's own, from its measured A/A floor (`default_min_effect`: `TPU_MIN_EFFECT` where
  every run ran on a TPU, else `MIN_EFFECT`), unless the caller names one (`--threshold`).
  With enough runs that the CI could reach 95% at all (`luck_bound`: 6+ interleaved pairs,
  or e.g. 4 + 4 independent runs), the CI decides. With fewer, the bootstrap cannot see how
  far whole processes of identical code fall apart, so the CI is widened by the
  *process-spread bound* (`spread_bound`): a log-normal process offset of SD `prior_log_sd`
  (the CPU machine's `PROCESS_LOG_SD`, a TPU's `TPU_PROCESS_LOG_SD`; or the runs' own
  spread, if larger) on each side, at the confidence's normal quantile. The labels
  (`verdict`, printed by `label`) say what was measured: a CI (widened where runs are few)
  clear of 1.00 is "slower"/"faster" at the minimum effect or more, else "detected, under
  the minimum effect"; a CI including 1.00 is "no detectable difference" (with its MDE)
  where the runs could reach the confidence, else "too few samples";
- MDE (minimum detectable effect): the CI's half-width relative to the ratio.

A sequential A/B (`parity ab`, `parity bisect`) asks for its looks' CIs at a higher
confidence (`compare(..., confidence=)`), and stops once a look settles the verdict:
`reports.sequential`. The trace explanation's "beyond noise" for an op is
`reports.trace_noise`'s, from this rule's process spread and minimum effect.

A cell's median over runs with its run-level CI is `reports.medians`'; instability and
machine warnings, printed beside a verdict but never deciding one, are `reports.noise`'s.
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
"""The minimum effect on the CPU machine, and on a backend whose A/A floor is not measured
(a GPU): the smallest relative difference that earns "slower" or "faster". A smaller one
whose CI is clear of 1.00 is "detected, under the minimum effect". The CPU machine's A/A
floor: `parity ab HEAD HEAD` at the defaults (16 lockstep rounds) reads MDEs of 3.1-7.5% on
a 2-core VM, and whole processes of identical code spread log-SD 0.04-0.08 idle, up to 0.29
when another process shares the machine (`PROCESS_LOG_SD`): a 5% difference is the smallest
such an A/B resolves, and a CI may exclude 1.00 for a 1-3% shift that is the machine's
state (which core, which neighbour) rather than the code (docs/numbers.md)."""
TPU_MIN_EFFECT = 0.01
"""The minimum effect where every run ran on a TPU (record backend `tpu`). The chip's A/A
floor, measured on one TPU v5e (qwen3-0.6b seq 1024 GA 1, `native`, 6 rounds of processes
one after the other): 1.000 [0.999, 1.002], MDE 0.1%, in 245 s; whole processes of
identical code spread log-SD 0.00044 pooled over 10 pairs (`TPU_PROCESS_LOG_SD`). 1% is ten
times that MDE: a verdict at 1% is no A/A noise of the chip measured, with room for what one
chip's floor cannot show (another chip or host of the kind, a nightly's history spread over
weeks). Smaller differences still print, as detected or not, with their CI."""
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
for hosts and chips not yet measured: at 2 runs a side exp(1.96 x 0.01) = 1.020; the runs'
own spread widens it where larger (`spread_bound`)."""
BUSY_PROCESS_LOG_SD = 0.5
"""The same where a run shared the machine with other processes (`Timing.other_load` above
`MAX_OTHER_LOAD`): a contended process ran at up to 2.4x the median of identical code here,
so a busy run's bound is exp(1.96 x 0.5 x sqrt(2)) = 4.0x at one run a side."""
MAX_OTHER_LOAD = 0.10
"""Share of the machine's CPU time other processes kept busy during a window above which a
run counts as busy (measured here: a cell sharing the 2-core VM with one other cell process
ran up to 2x slower)."""

Runs = Sequence[Sequence[float]]

SLOWER, FASTER, UNDER, SAME, TOO_FEW = (
    "slower", "faster", "detected, under the minimum effect", "no detectable difference",
    "too few samples")
"""The labels: beyond noise and at least the minimum effect; beyond noise but smaller (its
ratio and CI printed beside it); a CI including 1.00 from runs that could reach the
confidence (its MDE printed beside it); a CI including 1.00 from runs that could not."""
WITHIN = "within the minimum effect"
"""The label where the caller asked for no CI (`compare(..., full_ci=False)`) and the ratio
alone settles that there is no slower or faster: detected or not is then unknown."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Comparison:
    """median(new) / median(old) with its bootstrap CI, the sample sizes behind it and the
    rule it is judged by (its minimum effect and process spread)."""

    ratio: float
    """Ratio of pooled medians new/old: above 1 the new side is slower."""
    low: float | None
    """Lower end of the CI; None where it was not computed because no CI could change
    whether it is slower or faster (`compare(..., full_ci=False)`: a ratio within the
    minimum effect)."""
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
    log_sd: float = PROCESS_LOG_SD
    """The SD of log(process median) behind `spread_bound`: the prior (`prior_log_sd`), or
    the runs' own spread where larger."""
    backend: str | None = None
    """The one backend every run ran on (None: several, or unknown)."""
    busy: bool = False
    """A run shared the machine with other processes (the busy prior)."""
    min_effect: float = MIN_EFFECT
    """The smallest relative difference that earns slower or faster: the backend's
    (`default_min_effect`) unless the caller named one."""
    confidence: float = CONFIDENCE
    """The CI's confidence: CONFIDENCE, or a sequential A/B look's (reports.sequential)."""

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
        return {**dataclasses.asdict(self), "mde": self.mde, "verdict": verdict(self),
                "label": label(self)}


def default_min_effect(backend: str | None) -> float:
    """The minimum effect of runs on `backend` (every run's; None where they differ): a
    TPU's `TPU_MIN_EFFECT`, else the CPU machine's `MIN_EFFECT`."""
    return TPU_MIN_EFFECT if backend == "tpu" else MIN_EFFECT


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


def _rule(old: Sequence[np.ndarray], new: Sequence[np.ndarray], busy: bool,
          backend: str | None, min_effect: float | None, confidence: float) -> dict:
    """The fields of a Comparison that say how it is judged: the process spread of these
    runs (`process_log_sd`) and its bound at `confidence`, the backend, the minimum effect
    and the confidence."""
    sd = process_log_sd(old, new, busy=busy, backend=backend)
    return {"spread_bound": _process_bound(sd, len(old), len(new), confidence),
            "log_sd": sd, "backend": backend, "busy": busy, "confidence": confidence,
            "min_effect": default_min_effect(backend) if min_effect is None else min_effect}


def compare(old: Runs, new: Runs, *, paired: bool = False, seed: int = SEED,
            resamples: int = RESAMPLES, busy: bool = False, backend: str | None = None,
            min_effect: float | None = None, full_ci: bool = True,
            confidence: float = CONFIDENCE) -> Comparison:
    """median(new)/median(old) with a two-level (runs, then steps) bootstrap CI at
    `confidence` (a sequential A/B's look asks for more: reports.sequential).

    `paired`: run i of `old` ran next to run i of `new` (interleaved rounds); needs the same
    number of runs on both sides and resamples them together. Too few pairs to ever reach the
    confidence (`luck_bound`) are resampled as independent runs instead, which may. `busy`:
    a run shared the machine with other processes (its process-spread bound is wider);
    `backend`: the one backend every run ran on (`prior_log_sd`, `default_min_effect`);
    `min_effect`: the minimum effect to judge by (None: the backend's).

    `full_ci=False`: the caller wants only whether it is slower or faster, so the bootstrap
    is skipped (`low`/`high` None) where the ratio alone settles that: a ratio less than the
    minimum effect away from 1.00, or a run shorter than `MIN_STEPS`, is neither whatever
    its CI (`verdict` then says `WITHIN` or `TOO_FEW`).
    """
    old_runs, new_runs = _runs(old, "old"), _runs(new, "new")
    if paired and len(old_runs) != len(new_runs):
        raise ValueError(f"paired comparison needs equal runs, got {len(old_runs)} and "
                         f"{len(new_runs)}")
    paired = paired and (luck_bound(len(old_runs), len(new_runs), True) <= 1 - CONFIDENCE)
    ratio = float(np.median(np.concatenate(new_runs)) / np.median(np.concatenate(old_runs)))
    min_steps = min(len(r) for r in [*old_runs, *new_runs])
    judged = _rule(old_runs, new_runs, busy, backend, min_effect, confidence)
    effect = judged["min_effect"]
    sizes = {"ratio": ratio, "runs_old": len(old_runs), "runs_new": len(new_runs),
             "min_steps": min_steps, "paired": paired, **judged}
    if not full_ci and (min_steps < MIN_STEPS or 1 - effect < ratio < 1 + effect):
        return Comparison(low=None, high=None, **sizes)
    rng = np.random.default_rng(seed)
    picks_old = rng.integers(0, len(old_runs), (resamples, len(old_runs)))
    picks_new = (picks_old if paired
                 else rng.integers(0, len(new_runs), (resamples, len(new_runs))))
    ratios = (_resampled_medians(new_runs, picks_new, rng)
              / _resampled_medians(old_runs, picks_old, rng))
    tail = expanded_tail(min(len(old_runs), len(new_runs)), confidence) * 100
    return Comparison(low=float(np.percentile(ratios, tail)),
                      high=float(np.percentile(ratios, 100 - tail)), **sizes)


def compare_slices(old: Sequence[Sequence[Sequence[float]]],
                   new: Sequence[Sequence[Sequence[float]]], *, seed: int = SEED,
                   resamples: int = RESAMPLES, busy: bool = False,
                   backend: str | None = None, min_effect: float | None = None,
                   confidence: float = CONFIDENCE) -> Comparison:
    """median(new)/median(old) of two arms timed in one process in alternating slices
    (in-process pairing), each side given as processes x slices x steps; `busy`, `backend`,
    `min_effect` and `confidence` as `compare`'s.

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
    tail = expanded_tail(procs * slices, confidence) * 100
    ratio = float(np.median(n) / np.median(o))
    return Comparison(ratio=ratio, low=float(np.percentile(ratios, tail)),
                      high=float(np.percentile(ratios, 100 - tail)),
                      runs_old=procs * slices, runs_new=procs * slices,
                      min_steps=min(o.shape[1] * o.shape[2], n.shape[1] * n.shape[2]),
                      paired=True, **_rule([r.ravel() for r in o], [r.ravel() for r in n],
                                           busy, backend, min_effect, confidence))


def spread_bound(old: Sequence[np.ndarray], new: Sequence[np.ndarray],
                 confidence: float = CONFIDENCE, *, busy: bool = False,
                 backend: str | None = None) -> float:
    """exp(z x sd x sqrt(1/a + 1/b)) for a and b runs: how far apart the pooled medians of
    two sides of identical code may fall through process-to-process spread alone, sd being
    `process_log_sd`."""
    return _process_bound(process_log_sd(old, new, busy=busy, backend=backend), len(old),
                          len(new), confidence)


def process_log_sd(old: Sequence[np.ndarray], new: Sequence[np.ndarray], *,
                   busy: bool = False, backend: str | None = None) -> float:
    """`prior_log_sd(busy, backend)`, or the SD of the runs' log medians around their side's
    mean where that is larger (a noisier machine than the one measured)."""
    logs = [np.log([run_median(r) for r in side]) for side in (old, new)]
    deviations = np.concatenate([side - side.mean() for side in logs])
    dof = len(deviations) - 2
    observed = float(np.sqrt((deviations**2).sum() / dof)) if dof > 0 else 0.0
    return max(prior_log_sd(busy, backend), observed)


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


def verdict(c: Comparison, min_effect: float | None = None) -> str:
    """The label of `c` (new vs old; `min_effect`: instead of the comparison's own).

    The interval judged is the CI, widened by the process-spread bound where the runs are
    too few for the CI to reach the confidence (`Comparison.enough`). Clear of 1.00:
    `SLOWER`/`FASTER` at the minimum effect or more, else `UNDER`. Including 1.00: `SAME`
    where the runs could reach the confidence, else `TOO_FEW` (also under `MIN_STEPS` steps
    a run). Without a CI (`full_ci=False`) and within the minimum effect: `WITHIN`."""
    effect = c.min_effect if min_effect is None else min_effect
    if c.min_steps < MIN_STEPS:
        return TOO_FEW
    if c.low is None or c.high is None:  # skipped: the ratio is within the minimum effect
        if not 1 - effect < c.ratio < 1 + effect:
            raise ValueError(f"ratio {c.ratio:.3f} is {percent(effect)}+ away from 1.00: "
                             "its verdict needs the CI, which was not computed")
        return WITHIN
    low, high = c.low, c.high
    if not c.enough:
        low, high = low / c.spread_bound, high * c.spread_bound
    if low > 1.0:
        return SLOWER if c.ratio >= 1 + effect else UNDER
    if high < 1.0:
        return FASTER if c.ratio <= 1 - effect else UNDER
    return SAME if c.enough else TOO_FEW


def percent(fraction: float) -> str:
    """0.05 -> '5%', 0.015 -> '1.5%': a minimum effect as people write it."""
    return f"{fraction * 100:.3g}%"


def label(c: Comparison, min_effect: float | None = None, *, mde: bool = True) -> str:
    """`verdict` as printed: the minimum effect named where the difference is under it, and
    the MDE beside "no detectable difference" (`mde=False`: where a column shows it)."""
    found = verdict(c, min_effect)
    effect = percent(c.min_effect if min_effect is None else min_effect)
    if found == UNDER:
        return f"detected, under the {effect} minimum effect"
    if found == WITHIN:
        return f"within the {effect} minimum effect (CI not computed)"
    if found == SAME and mde and c.mde is not None:
        return f"{SAME} (MDE {c.mde:.1%})"
    return found


def describe(c: Comparison, min_effect: float | None = None) -> str:
    """'1.030 [1.029, 1.031]: detected, under the 5% minimum effect': the ratio, its CI (its
    confidence named where not CONFIDENCE's, `level`) and `label`, for a line that has no
    table around it."""
    ci = f" [{c.low:.3f}, {c.high:.3f}]{level(c)}" if c.low is not None else ""
    return f"{c.ratio:.3f}{ci}: {label(c, min_effect)}"


def level(c: Comparison) -> str:
    """' (99.64% CI)' beside a CI of another confidence than CONFIDENCE's (to the digit
    that keeps it under 100%), else ''."""
    if c.confidence == CONFIDENCE:
        return ""
    digits = max(0, math.ceil(-math.log10(1 - c.confidence)) - 1)
    return f" ({c.confidence * 100:.{digits}f}".rstrip("0").rstrip(".") + "% CI)"


LEGEND = ("Labels: slower / faster: the 95% CI (widened by the process-spread bound where runs are "
          "too few for 95% by the CI alone: under 6 interleaved pairs, or e.g. 4 + 4 "
          "independent runs) is clear of 1.00 and the difference is at least the minimum "
          "effect; detected, under the minimum effect: clear of 1.00, smaller; no detectable "
          "difference: the CI includes 1.00 (MDE: the smallest relative difference these "
          f"samples can detect); too few samples: it includes 1.00 and the runs (or under "
          f"{MIN_STEPS} steps a run) cannot reach 95%.")
"""What each label means, for the legend under a table of them."""


def _prior(c: Comparison) -> str:
    """The process spread a comparison assumed, in words."""
    if c.busy:
        return (f"log-SD {BUSY_PROCESS_LOG_SD:g} a process: a run shared the machine with "
                "other processes")
    if c.backend == "tpu":
        return (f"log-SD {TPU_PROCESS_LOG_SD:g} a process, a TPU's (0.00044 measured on one "
                "v5e chip)")
    which = "the CPU machine's, measured on a 2-core VM" + (
        f"; a {c.backend.upper()}'s is not measured" if c.backend not in (None, "cpu") else "")
    return f"log-SD {PROCESS_LOG_SD:g} a process ({which})"


def rule(found: Sequence[Comparison]) -> str:
    """The minimum effects and process spreads `found` were judged by, in words: what a
    printed rule names for those runs (one clause per distinct pair), and how far the runs'
    own spread exceeded the prior where it did."""
    clauses = []
    for effect, backend, prior in dict.fromkeys(
            (c.min_effect, c.backend, _prior(c)) for c in found):
        whose = ("a TPU's" if backend == "tpu" else "the CPU machine's")
        named = ("" if effect != default_min_effect(backend)
                 else f", {whose} from its A/A floor")
        clauses.append(f"minimum effect {percent(effect)}{named}; process spread {prior}")
    wider = [c.log_sd for c in found if c.log_sd > prior_log_sd(c.busy, c.backend)]
    if wider:
        clauses.append(f"the runs' own spread where wider ({len(wider)} comparisons, up to "
                       f"log-SD {max(wider):.3g})")
    return "; ".join(clauses)


def step_noise_bound(backend: str | None = None) -> float:
    """The process bound at one capture a side: 2.0x on the CPU machine, 1.028x on a TPU."""
    return _process_bound(prior_log_sd(backend=backend), 1, 1, CONFIDENCE)


def run_median(run: np.ndarray | Sequence[float]) -> float:
    """The median of one run's steps, the value np.median gives (the middle value, or the
    mean of the two middle values), without its overhead: a few dozen samples sort faster
    in Python than numpy sets up a partition."""
    return float(statistics.median(run.tolist() if isinstance(run, np.ndarray) else run))


def busy(other_loads: Sequence[float | None]) -> bool:
    """Did any run share the machine with other processes beyond `MAX_OTHER_LOAD`?"""
    return any(x is not None and x > MAX_OTHER_LOAD for x in other_loads)
