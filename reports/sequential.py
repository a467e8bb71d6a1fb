"""The sequential rule: an A/B (and each step of a bisection) that stops as soon as its
verdict at the minimum effect cannot change, and runs to its budget of rounds only when it
must.

After each round of a cell, a *look* compares the rounds run so far with the one statistics
rule (`stats.compare` / `stats.compare_slices`, through the caller's `compare_at`), at a
confidence raised for that look, so that all the looks of the A/B together make no more
false claims than one comparison at 95% would:

- **Repeated confidence intervals** (Jennison & Turnbull, "Repeated confidence intervals
  for group sequential clinical trials", Controlled Clinical Trials 5, 1984; "Group
  Sequential Methods with Applications to Clinical Trials", 2000, ch. 9): the intervals of
  every look cover the true ratio at once with probability 95% or more, so a decision read
  off any of them, at a stop chosen by looking at them, keeps that confidence.
- **Alpha spending** (Lan & DeMets, "Discrete sequential boundaries for clinical trials",
  Biometrika 70, 1983): the 5% the A/B may be wrong is spent by the information fraction
  t = rounds / budget, so the looks need not be planned (a look that is not taken spends
  nothing; the next one spends what it left). The interim looks spend at most
  `INTERIM_ALPHA` (1%) together, along the Pocock-type curve `INTERIM_ALPHA x ln(1 + (e -
  1) t)`; the look at the budget spends the rest, 4% or more (`spent`). This is
  Haybittle (1971) and Peto et al. (1976)'s shape written as a spending function: stringent
  interim looks, a last look near the nominal level (its CI at 96% or more, 95% exactly
  where no interim look was taken). Pocock's curve, not O'Brien & Fleming's, for the
  interim looks: it spends evenly, so a clear difference stops at the first look that can
  reach 95%; O'Brien-Fleming spends almost nothing early (2.6e-7 of the 1% at a quarter of
  the budget), which forbids the very stops this rule is for, and the last look is kept
  near 95% by the reservation instead.
- **Bonferroni between looks**: each look's CI is at confidence 1 - (the alpha it spends),
  so the chance that any look's CI misses the true ratio is at most the sum, 5%, whatever
  the looks' correlation. Exact group-sequential boundaries (Armitage, McPherson & Rowe's
  recursion) would be less conservative, but they assume the looks' statistics are a
  Brownian motion in the information; these are bootstrap intervals of medians over
  rounds, slices and steps (the expanded percentile interval), whose joint law across
  looks is not that. Bonferroni asks of each look only its own coverage.

Every slower or faster, early or at the budget, needs its look's CI clear of 1.00, so on an
A/A the chance that any look says slower or faster is at most 5% (simulated on the chip's
and the CPU machine's records: tests/reports/test_sequential.py, docs/numbers.md).

A look settles the cell (`settle`) where its CI lies wholly beyond 1 + m (slower) or below
1 - m (faster), m the minimum effect, or wholly inside (1 - m, 1 + m) (neither can be
reached: not a regression); otherwise the rounds go on. A look counts (is *taken*, spends
alpha) only where the ordinary rule could reach 95% at all (`stats.Comparison.enough`: the
luck bound, `MIN_STEPS` steps a run) and the cell has run the caller's fewest rounds (2 in
lockstep, where one round samples one process's luck a side): a look before that stops
nothing. At the budget the verdict is the ordinary one (`stats.verdict`) of the last look's
CI.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from reports import stats

ALPHA = 1 - stats.CONFIDENCE
"""What all the looks of one A/B may spend together: the chance that any of their CIs
misses the true ratio."""
INTERIM_ALPHA = 0.01
"""What the looks before the budget may spend together (the rest, 4% or more, is the last
look's: its CI is at 96% or more)."""
NEITHER = "neither slower nor faster"
"""A look's settlement where its CI lies wholly inside the minimum effect."""

CompareAt = Callable[[float], stats.Comparison | None]
"""The rounds run so far, compared at a confidence (None where they have no timing to
compare, e.g. a side whose cells failed)."""


def spent(fraction: float) -> float:
    """The alpha spent by information fraction `fraction` (rounds / budget): the
    Pocock-type `INTERIM_ALPHA x ln(1 + (e - 1) t)` before the budget, `ALPHA` at it."""
    if fraction >= 1:
        return ALPHA
    return INTERIM_ALPHA * math.log(1 + (math.e - 1) * max(fraction, 0.0))


def confidence(rounds: int, budget: int, spent_before: float) -> float:
    """The confidence of a look after `rounds` of `budget` rounds, where earlier looks
    spent `spent_before`: 1 - (what is spent by then - `spent_before`)."""
    return 1 - (spent(rounds / budget) - spent_before)


def first_round(slices: int = 0) -> int:
    """The first round whose look could count, where the runs could reach 95% at all
    (`stats.luck_bound`): with `slices` slice pairs a round (lockstep), the round that
    makes `stats.MIN_PAIRS` of them; with one process a side a round (`slices` 0), 4 (4 + 4
    independent runs: `stats.compare` resamples fewer than `MIN_PAIRS` pairs as such)."""
    if slices:
        return math.ceil(stats.MIN_PAIRS / slices)
    return next(n for n in range(1, stats.MIN_PAIRS + 1)
                if stats.luck_bound(n, n, False) <= ALPHA)


def settle(c: stats.Comparison | None) -> str | None:
    """What a look's comparison settles: `stats.SLOWER` where its CI lies wholly beyond
    1 + m, `stats.FASTER` wholly below 1 - m, `NEITHER` wholly inside (1 - m, 1 + m), m the
    comparison's minimum effect; None where more rounds could change the verdict, or where
    the runs could not reach 95% at all (`enough`)."""
    if c is None or c.low is None or c.high is None or not c.enough:
        return None
    effect, found = c.min_effect, stats.verdict(c)
    if c.low > 1 + effect and found == stats.SLOWER:
        return stats.SLOWER
    if c.high < 1 - effect and found == stats.FASTER:
        return stats.FASTER
    if 1 - effect < c.low and c.high < 1 + effect:
        return NEITHER
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Look:
    """One look at a cell's rounds: its comparison, what it spent and what it settled."""

    rounds: int
    """Rounds of both sides the look read."""
    budget: int
    """The most rounds the A/B may run (--rounds)."""
    comparison: stats.Comparison | None
    """The rounds compared at this look's confidence (None: nothing to compare)."""
    spent: float
    """The alpha spent by this look and those before it."""
    taken: bool
    """The look counted: it spent alpha and could stop the cell (the runs could reach 95%
    and the cell ran its fewest rounds; the look at the budget always counts)."""
    settled: str | None
    """`stats.SLOWER`, `stats.FASTER` or `NEITHER` where the look settled the verdict;
    None where it did not (nor ever where the budget was asked for: `early` False)."""
    early: bool = True
    """Looks before the budget were allowed (False: the A/B ran its whole budget by
    request, and its one look is the ordinary 95% comparison)."""
    failed: str | None = None
    """Which side failed in every round so far ('A', 'B' or 'A and B'), where one did:
    nothing to compare, and no round runs after it (the side's records name the cause)."""

    @property
    def last(self) -> bool:
        """No round runs after this look: it settled the cell, a side failed every round,
        or the budget is spent."""
        return self.settled is not None or self.failed is not None or \
            self.rounds >= self.budget

    def reason(self) -> str:
        """How many rounds the cell ran and why it stopped, e.g. 'settled: slower beyond
        the 1% minimum effect after 2 of 16 rounds', 'budget: 16 of 16 rounds, not
        settled'; '' for a look that is not the last."""
        of = f"{self.rounds} of {self.budget} rounds"
        if self.failed is not None:
            who = "A's and B's cells" if self.failed == "A and B" else f"{self.failed}'s cell"
            return f"failed: {who} failed in every round, after {of}"
        if self.settled is not None:
            effect = stats.percent(self.comparison.min_effect)
            what = (f"{self.settled} beyond the {effect} minimum effect"
                    if self.settled != NEITHER else
                    f"within the {effect} minimum effect ({NEITHER})")
            return f"settled: {what} after {of}"
        if not self.last:
            return ""
        return f"budget: {of}, " + ("not settled" if self.early else "no early stop asked")


def look(compare_at: CompareAt, *, rounds: int, budget: int, spent_before: float = 0.0,
         min_rounds: int = 1, early: bool = True) -> Look:
    """The look after `rounds` of `budget` rounds, earlier looks having spent
    `spent_before`: the rounds compared at this look's `confidence`, taken where the runs
    could reach 95% and `min_rounds` have run (always at the budget), and what it settles
    (`settle`; at the budget too). `early=False`: no look before the budget counts, so the
    one at it is the ordinary 95% comparison, and settles nothing (the budget was asked
    for)."""
    final = rounds >= budget
    compared = compare_at(confidence(rounds, budget, spent_before))
    taken = final or (early and rounds >= min_rounds and compared is not None
                      and compared.enough)
    spent_now = spent(rounds / budget) if taken else spent_before
    return Look(rounds=rounds, budget=budget, comparison=compared, spent=spent_now,
                taken=taken, settled=settle(compared) if taken and early else None,
                early=early)


def until_settled(compare_rounds: Callable[[int, float], stats.Comparison | None], *,
                  budget: int, min_rounds: int = 1, early: bool = True) -> Look:
    """The rule over rounds already run (a simulation's, or stored ones): `look` after
    each round, `compare_rounds(rounds, confidence)` comparing the first `rounds`, until a
    look is the last (`Look.last`); returns that look. With `early=False` only the look at
    the budget is made."""
    spent_so_far, rounds = 0.0, budget if not early else min(min_rounds, budget)
    while True:
        found = look(lambda level, n=rounds: compare_rounds(n, level), rounds=rounds,
                     budget=budget, spent_before=spent_so_far, min_rounds=min_rounds,
                     early=early)
        if found.last:
            return found
        spent_so_far, rounds = found.spent, rounds + 1
