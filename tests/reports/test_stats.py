"""The one statistics rule on synthetic samples with known answers (no timing involved).

The samples imitate what a CPU runner shows: each process has its own offset (memory
layout, machine state: `run_sd`), the machine drifts between rounds (`drift_sd`, the same
for both sides of an interleaved round) and steps scatter inside a process (`step_sd`).
Seeds are fixed, so every test is deterministic.
"""

import numpy as np
import pytest

from reports import stats


def _side(rng, *, rounds=6, steps=60, scale=1.0, run_sd=0.02, step_sd=0.05, drift=None):
    drift = np.zeros(rounds) if drift is None else drift
    return [100 * scale * (1 + d + rng.normal(0, run_sd)) * (1 + rng.normal(0, step_sd, steps))
            for d in drift]


def _verdicts(shift, *, draws=40, paired=False, drift_sd=0.0, **kw):
    found = []
    for seed in range(draws):
        rng = np.random.default_rng(seed)
        drift = rng.normal(0, drift_sd, kw.get("rounds", 6))
        old = _side(rng, drift=drift, **kw)
        new = _side(rng, scale=1 + shift, drift=drift, **kw)
        found.append(stats.verdict(stats.compare(old, new, paired=paired, resamples=500)))
    return found


def test_a_a_draws_are_almost_never_flagged():
    verdicts = _verdicts(0.0)
    flagged = sum(v != stats.SAME for v in verdicts)
    # 95% CIs plus the 5% minimum effect: at most 1 of 40 A/A comparisons may be flagged.
    assert flagged <= 1, verdicts


def test_a_planted_10_percent_slowdown_is_detected():
    verdicts = _verdicts(0.10)
    assert verdicts.count(stats.SLOWER) >= 38, verdicts  # power >= 95% at this noise
    assert stats.FASTER not in verdicts


def test_a_planted_10_percent_speedup_is_called_faster():
    assert _verdicts(-0.10).count(stats.FASTER) >= 38


def test_pairing_cancels_drift_that_hits_both_sides_of_a_round():
    # 15% round-to-round drift of the machine: unpaired, a 10% slowdown drowns in it;
    # paired (interleaved rounds resampled together), it is found.
    unpaired = _verdicts(0.10, drift_sd=0.15, rounds=8)
    paired = _verdicts(0.10, drift_sd=0.15, paired=True, rounds=8)
    assert paired.count(stats.SLOWER) >= 36, paired
    assert unpaired.count(stats.SLOWER) < paired.count(stats.SLOWER) - 10, unpaired


def test_too_few_runs_or_steps_is_never_significant():
    rng = np.random.default_rng(0)
    two_runs = stats.compare(_side(rng, rounds=2), _side(rng, rounds=2, scale=2.0))
    assert two_runs.low > 1.5  # the CI alone would call it
    assert stats.verdict(two_runs) == stats.TOO_FEW
    few_steps = stats.compare(_side(rng, steps=3), _side(rng, steps=3, scale=2.0))
    assert stats.verdict(few_steps) == stats.TOO_FEW


def test_a_shift_below_the_minimum_effect_earns_no_verdict():
    # Almost no noise: the CI excludes 1.00 for a 2% shift, the rule still says "same".
    rng = np.random.default_rng(0)
    c = stats.compare(_side(rng, run_sd=0.001, step_sd=0.001),
                      _side(rng, scale=1.02, run_sd=0.001, step_sd=0.001))
    assert c.low > 1.0 and stats.verdict(c) == stats.SAME
    assert stats.verdict(c, min_effect=0.01) == stats.SLOWER


def test_mde_shrinks_with_more_rounds():
    rng = np.random.default_rng(0)
    few = stats.compare(_side(rng, rounds=3), _side(rng, rounds=3))
    many = stats.compare(_side(rng, rounds=12), _side(rng, rounds=12))
    assert many.mde < few.mde


def test_paired_needs_equal_runs():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="paired comparison needs equal runs"):
        stats.compare(_side(rng, rounds=3), _side(rng, rounds=4), paired=True)


def test_same_samples_same_ci():
    rng = np.random.default_rng(0)
    old, new = _side(rng), _side(rng, scale=1.1)
    assert stats.compare(old, new) == stats.compare(old, new)


def test_median_ci_covers_the_center_and_needs_three_runs():
    rng = np.random.default_rng(0)
    ci = stats.median_ci(_side(rng, rounds=9))
    assert ci.low < 100 < ci.high and ci.runs == 9
    assert stats.median_ci(_side(rng, rounds=2)).low is None


def test_instability_warnings():
    rng = np.random.default_rng(0)
    assert stats.warnings(_side(rng)) == []
    noisy = stats.warnings(_side(rng, step_sd=0.3))
    assert noisy[0].startswith("unstable steps: CV")
    disagree = stats.warnings(_side(rng, run_sd=0.2, step_sd=0.01))
    assert any(w.startswith("runs disagree") for w in disagree)


@pytest.mark.parametrize(("rounds", "paired"), [(6, True), (4, False), (8, True)])
def test_the_interval_keeps_its_coverage_with_few_runs(rounds, paired):
    # Process-level noise dominates (10% between runs, 1% inside). A plain percentile
    # interval from 8 runs excludes 1.00 in ~8% of A/A draws (the resampled spread is too
    # small); the expanded one must stay near the nominal 5%. 100 draws; allow up to 9
    # (the binomial 95th percentile at 5%).
    misses = 0
    for seed in range(100):
        rng = np.random.default_rng(1000 + seed)
        c = stats.compare(_side(rng, rounds=rounds, run_sd=0.10, step_sd=0.01),
                          _side(rng, rounds=rounds, run_sd=0.10, step_sd=0.01),
                          paired=paired, resamples=2000)
        misses += c.low > 1.0 or c.high < 1.0
    assert misses <= 9, misses


def test_samples_that_cannot_reach_95_percent_are_too_few():
    # 5 interleaved pairs all on one side happen by luck 1 time in 16 (> 5%): never a verdict.
    assert stats.luck_bound(5, 5, paired=True) == 2.0**-4
    assert stats.luck_bound(6, 6, paired=True) < 0.05 <= stats.luck_bound(3, 3, paired=False)
    assert stats.luck_bound(4, 4, paired=False) < 0.05
    rng = np.random.default_rng(0)
    five = stats.compare(_side(rng, rounds=5), _side(rng, rounds=5, scale=2.0), paired=True)
    assert not five.paired and stats.verdict(five) == stats.SLOWER  # 5 + 5 independent: ok
    three = stats.compare(_side(rng, rounds=3), _side(rng, rounds=3, scale=2.0), paired=True)
    assert three.low > 1.5 and stats.verdict(three) == stats.TOO_FEW
