"""Simulated A/Bs through the sequential rule (reports.sequential), each round's processes
drawn by resampling recorded ones.

- The TPU v5e chip's (docs/results/tpu-v5e/h2h/*.jsonl): every cell run there as 2 or 3
  processes of identical code, 20 timed steps each (15 cells: 7 at seq 1024 GA 1, 4 at GA
  4, 4 at seq 4096). A simulated process is one of its cell's recorded processes (drawn
  at random), `STEPS` of its steps drawn with replacement; A and B draw from the same
  cell, so an A/A is identical code, and B's times are multiplied by 1 + `shift` for a
  planted difference. Rounds are A's and B's processes one after the other (the pairing on
  an accelerator): `stats.compare`, paired, as `parity ab` compares them.
- The CPU machine's (tests/reports/fixtures/results.jsonl: 12 recorded CPU processes of 5
  steps): a simulated process is one recorded process's steps around its own median,
  `STEPS` of them drawn with replacement, times a process offset of log-SD
  `CPU_PROCESS_LOG_SD` (the spread of whole processes of identical code measured on the
  2-core VM, 0.04-0.08 idle: docs/numbers.md) and, slice by slice, a drift of the machine
  shared by A's and B's slices of a round (log-SD `CPU_DRIFT_LOG_SD`). Rounds are lockstep
  (`SLICES` slices a process): `stats.compare_slices`, as `parity ab` compares them on the
  CPU.

A look's comparison runs with `resamples` bootstrap resamples instead of the 10,000 of a
real A/B: fewer resamples put a look's far percentiles nearer the middle (the smallest of
200 ratios for a tail of 0.02%), so a simulated look is less strict than a real one and
the false-positive rates measured here overstate the real rule's.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from reports import sequential, stats
from reports.compare import cells
from reports.record import codec
from tests.reports.helpers import fixture_records

CHIP = Path(__file__).resolve().parents[2] / "docs" / "results" / "tpu-v5e" / "h2h"
STEPS = 10
"""Timed steps of a simulated process: `parity ab`'s default (harness.jobs.ab.STEPS)."""
SLICES = 5
"""Slices of a simulated lockstep process: `parity ab`'s default."""
LOCKSTEP_FIRST_LOOK = max(2, sequential.first_round(SLICES))
"""The first round a lockstep look may stop (harness.grid.options.first_look: 2)."""
CPU_PROCESS_LOG_SD = 0.06
CPU_DRIFT_LOG_SD = 0.03


@functools.cache
def chip_cells() -> tuple[tuple[np.ndarray, ...], ...]:
    """Each chip cell of 2+ recorded processes: their per-step times (ms)."""
    found = []
    for path in sorted(CHIP.glob("chip-h2h-*.jsonl")):
        for cell in cells(list(codec.read(path))):
            if len(cell.runs) >= 2:
                found.append(tuple(np.asarray(run, np.float64) for run in cell.runs))
    return tuple(found)


@functools.cache
def cpu_processes() -> tuple[np.ndarray, ...]:
    """Each recorded CPU process's steps over its own median."""
    runs = [np.asarray(r.timing.step_ms, np.float64) for r in fixture_records()
            if r.ok and r.timing]
    return tuple(run / np.median(run) for run in runs)


def _steps(rng: np.random.Generator, process: np.ndarray, count: int) -> np.ndarray:
    return process[rng.integers(0, len(process), count)]


def chip_rounds(rng: np.random.Generator, budget: int,
                shift: float) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A's and B's processes of `budget` rounds of one chip cell drawn at random."""
    cell = chip_cells()[rng.integers(len(chip_cells()))]
    a = [_steps(rng, cell[rng.integers(len(cell))], STEPS) for _ in range(budget)]
    b = [_steps(rng, cell[rng.integers(len(cell))], STEPS) * (1 + shift)
         for _ in range(budget)]
    return a, b


def cpu_rounds(rng: np.random.Generator, budget: int,
               shift: float) -> tuple[np.ndarray, np.ndarray]:
    """A's and B's lockstep processes of `budget` rounds (rounds x slices x steps)."""
    drift = np.exp(rng.normal(0, CPU_DRIFT_LOG_SD, (budget, SLICES, 1)))
    processes = cpu_processes()

    def side(scale: float) -> np.ndarray:
        steps = np.stack([_steps(rng, processes[rng.integers(len(processes))], STEPS)
                          for _ in range(budget)]).reshape(budget, SLICES, STEPS // SLICES)
        offsets = np.exp(rng.normal(0, CPU_PROCESS_LOG_SD, (budget, 1, 1)))
        return steps * offsets * drift * scale

    return side(1.0), side(1 + shift)


def chip_ab(a: list[np.ndarray], b: list[np.ndarray], *, min_effect: float | None = None,
            resamples: int, early: bool = True) -> sequential.Look:
    """The sequential rule over chip rounds, at `min_effect` (None: a TPU's)."""

    def compare(rounds: int, confidence: float) -> stats.Comparison:
        return stats.compare(a[:rounds], b[:rounds], paired=True, backend="tpu",
                             min_effect=min_effect, resamples=resamples,
                             confidence=confidence)

    return sequential.until_settled(compare, budget=len(a), early=early,
                                    min_rounds=sequential.first_round())


def cpu_ab(a: np.ndarray, b: np.ndarray, *, min_effect: float | None = None, resamples: int,
           early: bool = True) -> sequential.Look:
    """The sequential rule over lockstep CPU rounds, at `min_effect` (None: the CPU's)."""

    def compare(rounds: int, confidence: float) -> stats.Comparison:
        return stats.compare_slices(a[:rounds], b[:rounds], backend="cpu",
                                    min_effect=min_effect, resamples=resamples,
                                    confidence=confidence)

    return sequential.until_settled(compare, budget=len(a), early=early,
                                    min_rounds=LOCKSTEP_FIRST_LOOK)


def declared(look: sequential.Look) -> bool:
    """The A/B said slower or faster (early or at its budget)."""
    return stats.verdict(look.comparison) in (stats.SLOWER, stats.FASTER)


def binomial_ci(hits: int, n: int) -> tuple[float, float]:
    """The exact (Clopper-Pearson) 95% CI of a rate of `hits` in `n`."""
    from scipy import stats as scipy_stats

    found = scipy_stats.binomtest(hits, n).proportion_ci(0.95)
    return float(found.low), float(found.high)
