"""The one statistics rule on synthetic samples with known answers (no timing involved).

The samples imitate what a CPU runner shows: each process has its own offset (memory
layout, machine state: `run_sd`), the machine drifts between rounds (`drift_sd`, the same
for both sides of an interleaved round) and steps scatter inside a process (`step_sd`).
Seeds are fixed, so every test is deterministic.
"""

import numpy as np
import pytest

from reports import medians, noise, stats, trace_noise


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
    flagged = sum(v in (stats.SLOWER, stats.FASTER) for v in verdicts)
    # 95% CIs plus the 5% minimum effect: at most 1 of 40 A/A comparisons may be flagged.
    assert flagged <= 1, verdicts
    # A 95% CI misses 1.00 for about 5% of A/A draws, which the label says as it is: a
    # detection under the minimum effect (2 of these 40), never slower or faster.
    assert verdicts.count(stats.UNDER) <= 4, verdicts
    assert set(verdicts) <= {stats.SAME, stats.UNDER}, verdicts


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


def test_too_few_runs_decide_only_beyond_the_process_spread_bound():
    rng = np.random.default_rng(0)
    # 2 + 2 runs: the bound is exp(1.96 x 0.25 x sqrt(1/2 + 1/2)) = 1.63.
    two_runs = stats.compare(_side(rng, rounds=2), _side(rng, rounds=2, scale=1.4))
    assert two_runs.spread_bound == pytest.approx(np.exp(1.959964 * 0.25), rel=1e-6)
    assert two_runs.low > 1.3  # the CI alone would call it ...
    assert stats.verdict(two_runs) == stats.TOO_FEW  # ... but processes can differ that much
    tripled = stats.compare(_side(rng, rounds=2), _side(rng, rounds=2, scale=3.0))
    assert stats.verdict(tripled) == stats.SLOWER
    third = stats.compare(_side(rng, rounds=2, scale=3.0), _side(rng, rounds=2))
    assert stats.verdict(third) == stats.FASTER
    few_steps = stats.compare(_side(rng, steps=3), _side(rng, steps=3, scale=3.0))
    assert stats.verdict(few_steps) == stats.TOO_FEW  # under MIN_STEPS: never a verdict


def test_one_run_a_side_decides_a_tripled_step_time_and_not_identical_code():
    # One process a side, 10 steps: the bound is exp(1.96 x 0.25 x sqrt(2)) = 2.0.
    rng = np.random.default_rng(0)
    one = stats.compare(_side(rng, rounds=1, steps=10), _side(rng, rounds=1, steps=10))
    assert one.spread_bound == pytest.approx(np.exp(1.959964 * 0.25 * 2**0.5), rel=1e-6)
    assert stats.verdict(one) == stats.TOO_FEW
    tripled = stats.compare(_side(rng, rounds=1, steps=10),
                            _side(rng, rounds=1, steps=10, scale=3.0))
    assert stats.verdict(tripled) == stats.SLOWER
    assert stats.verdict(stats.compare(_side(rng, rounds=1, steps=10),
                                       _side(rng, rounds=1, steps=10, scale=1.8))) == (
        stats.TOO_FEW)


def test_the_spread_bound_grows_with_the_runs_own_spread():
    # Runs whose medians scatter far more than PROCESS_LOG_SD widen the bound themselves.
    rng = np.random.default_rng(0)
    calm = stats.compare(_side(rng, rounds=3), _side(rng, rounds=3))
    # Run medians 50-210 ms: log-SD about 0.75 around each side's mean.
    wild = stats.compare([[100.0] * 10, [200.0] * 10, [50.0] * 10],
                         [[100.0] * 10, [210.0] * 10, [48.0] * 10])
    assert calm.spread_bound == pytest.approx(np.exp(1.959964 * 0.25 * (2 / 3) ** 0.5),
                                              rel=1e-6)
    assert wild.spread_bound > 3.0 > 1.5 > calm.spread_bound


def test_a_shift_below_the_minimum_effect_is_detected_under_it_never_slower():
    # Almost no noise: the CI excludes 1.00 for a 2% shift; under the CPU machine's 5%
    # minimum effect it is detected, not slower; at a 1% minimum effect it is slower.
    rng = np.random.default_rng(0)
    c = stats.compare(_side(rng, run_sd=0.001, step_sd=0.001),
                      _side(rng, scale=1.02, run_sd=0.001, step_sd=0.001))
    assert c.low > 1.0 and c.min_effect == stats.MIN_EFFECT
    assert stats.verdict(c) == stats.UNDER
    assert stats.label(c) == "detected, under the 5% minimum effect"
    assert stats.verdict(c, min_effect=0.01) == stats.SLOWER
    faster = stats.compare(_side(rng, run_sd=0.001, step_sd=0.001),
                           _side(rng, scale=0.98, run_sd=0.001, step_sd=0.001))
    assert faster.high < 1.0 and stats.verdict(faster) == stats.UNDER


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
    ci = medians.median_ci(_side(rng, rounds=9))
    assert ci.low < 100 < ci.high and ci.runs == 9
    assert medians.median_ci(_side(rng, rounds=2)).low is None


def test_instability_warnings():
    rng = np.random.default_rng(0)
    assert noise.warnings(_side(rng)) == []
    noisy = noise.warnings(_side(rng, step_sd=0.3))
    assert noisy[0].startswith("unstable steps: CV")
    disagree = noise.warnings(_side(rng, run_sd=0.2, step_sd=0.01))
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
    three = stats.compare(_side(rng, rounds=3), _side(rng, rounds=3, scale=1.4), paired=True)
    assert three.low > 1.3 and stats.verdict(three) == stats.TOO_FEW  # inside the 1.49x bound


def _processes(rng, *, procs=3, slices=8, steps=5, shift=0.0, proc_sd=0.15, slice_sd=0.02,
               step_sd=0.05):
    """Two arms timed in the same processes in alternating slices: each process has its
    own offset (shared by both arms), each slice the machine's state then (shared by the
    pair); steps scatter on their own."""
    old, new = [], []
    for _ in range(procs):
        offset = rng.normal(0, proc_sd)
        state = rng.normal(0, slice_sd, slices)
        old.append([100 * (1 + offset + s) * (1 + rng.normal(0, step_sd, steps))
                    for s in state])
        new.append([100 * (1 + shift) * (1 + offset + s) * (1 + rng.normal(0, step_sd, steps))
                    for s in state])
    return old, new


def test_slice_pairs_resolve_5_percent_that_process_spread_hides():
    # Processes 15% apart: as separate runs a 5% slowdown is lost; paired by slice it is
    # found, and an A/A is not flagged.
    found, unpaired, flagged = [], [], []
    for seed in range(20):
        rng = np.random.default_rng(seed)
        old, new = _processes(rng, shift=0.06)
        found.append(stats.verdict(stats.compare_slices(old, new, resamples=1000)))
        runs = [[x for s in p for x in s] for p in old], [[x for s in p for x in s]
                                                          for p in new]
        unpaired.append(stats.verdict(stats.compare(*runs, resamples=1000)))
        same_old, same_new = _processes(rng)
        flagged.append(stats.verdict(stats.compare_slices(same_old, same_new,
                                                          resamples=1000)))
    assert found.count(stats.SLOWER) >= 18, found
    assert unpaired.count(stats.SLOWER) <= 2, unpaired
    assert sum(v != stats.SAME for v in flagged) <= 1, flagged


def test_slice_comparison_counts_pairs_and_checks_shapes():
    rng = np.random.default_rng(0)
    old, new = _processes(rng, procs=2, slices=4)
    c = stats.compare_slices(old, new, resamples=500)
    assert (c.runs_old, c.runs_new, c.min_steps, c.paired) == (8, 8, 20, True)
    few_old, few_new = _processes(rng, procs=1, slices=2, shift=0.5)
    # 2 pairs cannot reach 95% by the CI; 1.5x is inside the process-spread bound (2.0x).
    assert stats.verdict(stats.compare_slices(few_old, few_new, resamples=500)) == (
        stats.TOO_FEW)
    with pytest.raises(ValueError, match="processes x slices x steps"):
        stats.compare_slices(old, new[:1])


def test_machine_noise_is_told_apart_from_an_unstable_arm():
    steady = [[9.0, 9.1, 9.0], [9.1, 9.0, 9.2]]
    assert noise.machine_warnings(steady, [0.0, 0.001]) == []
    # The probe's best of each run: 9.0 and 12.9 ms, 36% apart (it spreads up to 32% idle).
    assert noise.machine_warnings([[9.0, 9.1, 9.0], [12.9, 13.2, 13.0]], [0, 0]) == [
        "machine noisy: the fixed-work probe's best took 9.00-12.90 ms across runs (36% "
        "spread)"]
    assert noise.machine_warnings([[9.0, 9.1], [11.5, 11.9]], [0, 0]) == []  # 24%: idle-like
    assert noise.machine_warnings(steady, [0.05, None]) == [
        "machine noisy: the hypervisor took 5.0% of CPU time during a run (steal)"]
    assert noise.machine_warnings(steady, [0.0, 0.0], [0.02, 0.45]) == [
        "machine busy: other processes used 45% of its CPU during a run"]


def test_a_run_that_shared_the_machine_widens_the_bound():
    # One run a side at 3x: decided on a quiet machine (bound 2.0x), not where a run shared
    # the machine with other processes (bound 4.0x: a contended process ran 2.4x slow here).
    rng = np.random.default_rng(0)
    old, new = _side(rng, rounds=1, steps=10), _side(rng, rounds=1, steps=10, scale=3.0)
    assert stats.verdict(stats.compare(old, new)) == stats.SLOWER
    busy = stats.compare(old, new, busy=True)
    assert busy.spread_bound == pytest.approx(np.exp(1.959964 * 0.5 * 2**0.5), rel=1e-6)
    assert stats.verdict(busy) == stats.TOO_FEW
    assert stats.busy([0.01, None, 0.3]) and not stats.busy([0.01, None])


def test_runs_on_a_tpu_decide_at_the_tpu_s_process_spread():
    # 2 + 2 runs at 1.4x: too few on the CPU machine (bound 1.63x), decided on a TPU, where
    # processes of identical code were measured 0.15% apart at most (bound 1.02x); a run
    # that shared the machine keeps the busy bound whatever the backend.
    rng = np.random.default_rng(0)
    quiet = {"rounds": 2, "run_sd": 0.001, "step_sd": 0.001}  # a chip: CV 0.001
    old, new = _side(rng, **quiet), _side(rng, **quiet, scale=1.4)
    assert stats.verdict(stats.compare(old, new)) == stats.TOO_FEW
    tpu = stats.compare(old, new, backend="tpu")
    assert tpu.spread_bound == pytest.approx(np.exp(1.959964 * 0.01), rel=1e-6)
    assert stats.verdict(tpu) == stats.SLOWER
    assert stats.compare(old, new, backend="gpu").spread_bound == pytest.approx(
        np.exp(1.959964 * 0.25), rel=1e-6)  # not measured: the CPU machine's bound
    busy = stats.compare(old, new, backend="tpu", busy=True)
    assert busy.spread_bound == pytest.approx(np.exp(1.959964 * 0.5), rel=1e-6)
    assert stats.one_backend(["tpu", "tpu"]) == "tpu"
    assert stats.one_backend(["tpu", "cpu"]) is None and stats.one_backend([]) is None


def test_median_ci_is_scipys_percentile_bootstrap_to_the_bit():
    """median_cis bootstraps many cells in one call of scipy.stats.bootstrap (for speed):
    each gets the interval of its own call, for odd and even run counts and runs of unequal
    length, alone or batched with others."""
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(11)
    samples = [[rng.normal(100, 5, rng.integers(5, 40)) for _ in range(runs)]
               for runs in (3, 4, 5, 8, 13, 5, 5)]
    batched = medians.median_cis(samples)
    for sample, together in zip(samples, batched, strict=True):
        ours = medians.median_ci(sample)
        assert (together.low, together.high) == (ours.low, ours.high)
        run_medians = np.array([np.median(r) for r in sample])
        theirs = scipy_stats.bootstrap(
            (run_medians,), np.median, confidence_level=stats.CONFIDENCE,
            n_resamples=stats.RESAMPLES, method="percentile",
            random_state=np.random.default_rng(stats.SEED)).confidence_interval
        assert (ours.low, ours.high) == (theirs.low, theirs.high)
        assert ours.median == np.median(run_medians)
    assert all(stats.run_median(r) == np.median(r) for r in
               [rng.normal(0, 1, rng.integers(1, 60)) for _ in range(500)])


def test_a_trace_mover_needs_disjoint_steps_a_process_sized_ratio_and_a_share_of_the_step():
    step = 10.0  # ms; 5% of it is 0.5 ms
    assert trace_noise.beyond_step_noise([1.0, 1.1, 0.9], [3.0, 3.2, 2.9], step)
    assert trace_noise.beyond_step_noise([3.0, 3.2, 2.9], [1.0, 1.1, 0.9], step)  # either way
    # overlapping steps: within the A/A noise of its own steps, however far the means are
    assert not trace_noise.beyond_step_noise([1.0, 1.1, 3.5], [3.0, 3.2, 2.9], step)
    # disjoint, but 1.9x: two whole processes of identical code may differ by 2.0x
    assert not trace_noise.beyond_step_noise([1.0, 1.0, 1.0], [1.9, 1.9, 1.9], step)
    # disjoint and 3x, but 0.2 ms of a 10 ms step: it cannot explain a verdict
    assert not trace_noise.beyond_step_noise([0.1, 0.1, 0.1], [0.3, 0.3, 0.3], step)
    # one slow step (a cold first step) moves the mean 20x, not the median
    assert not trace_noise.beyond_step_noise([0.5, 0.5, 0.5], [30.0, 0.6, 0.6], step)
    # an op on one side only is not compared here (it is listed as one side's)
    assert not trace_noise.beyond_step_noise([], [3.0], step)


def test_a_trace_mover_on_a_tpu_clears_the_tpus_process_spread_not_the_cpu_machines():
    """One capture a side, one process each: 2.0x may separate two CPU processes of
    identical code, 1.028x two on a TPU (TPU_PROCESS_LOG_SD); the share of the step a mover
    needs is the backend's minimum effect: 5% on the CPU machine, 1% on a TPU."""
    assert stats.step_noise_bound() == pytest.approx(2.0, abs=0.05)
    assert stats.step_noise_bound("tpu") == pytest.approx(1.028, abs=0.001)
    step = 10.0
    assert not trace_noise.beyond_step_noise([5.0, 5.0, 5.0], [5.6, 5.6, 5.6], step)
    assert trace_noise.beyond_step_noise([5.0, 5.0, 5.0], [5.6, 5.6, 5.6], step, "tpu")
    assert trace_noise.beyond_step_noise([5.0, 5.0, 5.0], [5.4, 5.4, 5.4], step, "tpu")  # 4%
    assert not trace_noise.beyond_step_noise([5.0, 5.0, 5.0], [5.4, 5.4, 5.4], step)  # < 5%
    # 1.08x, beyond the TPU's process bound, but 0.08 ms of a 10 ms step: under its 1%
    assert not trace_noise.beyond_step_noise([1.0, 1.0, 1.0], [1.08, 1.08, 1.08], step, "tpu")
    assert trace_noise.beyond_step_noise([1.0, 1.0, 1.0], [1.12, 1.12, 1.12], step, "tpu")
