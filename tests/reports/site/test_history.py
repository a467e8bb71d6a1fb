"""The site's verdicts are the nightly's: every run of a synthetic history judged by
reports.site.history equals what reports.regression.against_history says for that run with
the history as it stood when the run ended; the planted events get the verdicts they must."""

import dataclasses

import pytest

from reports import medians, stats
from reports.regression import against_history
from reports.site.history import (
    BROKEN,
    IMPROVED,
    NOT_COMPARABLE,
    OK,
    REGRESSED,
    by_cell,
    cell_history,
    kind,
)
from tests.reports.site import synthetic

NIGHTS = 40
ARMS = ("engine", "native", "peft-maxtext")
STEPS = 8
"""Steps a round: few, so that the nightly's own bootstrap of every run stays quick here."""


@pytest.fixture(scope="module")
def records():
    return synthetic.nightly_history(nights=NIGHTS, arms=ARMS, presets=("qwen3-8b",),
                                     gas=(4,), seed=1, steps=STEPS)


@pytest.fixture(scope="module")
def histories(records):
    return {cid.arm: cell_history(cid, group, threshold=0.05)
            for cid, group in by_cell(records).items()}


def test_every_run_gets_the_nightlys_status_timing_verdict_and_cost_changes(records,
                                                                             histories):
    checked = 0
    for history in histories.values():
        for view in [*history.timed, *history.plans]:
            run = view.run_id
            before = [r for r in records if r.timestamp <= view.records[-1].timestamp]
            (row,) = [row for row in against_history(
                [r for r in records if r.run_id == run and r.arm == history.id.arm],
                before, threshold=0.05)]
            assert view.row.status == row.status, (history.id.name, run)
            if row.comparison is None:
                assert view.row.comparison is None
                continue
            mine, theirs = view.row.comparison, row.comparison
            # The dashboard skips the CI where the ratio is within the threshold: there it
            # says so (stats.WITHIN), where the nightly says detected-under or not.
            assert mine.verdict == theirs.verdict or (
                mine.verdict == stats.WITHIN
                and theirs.verdict in (stats.UNDER, stats.SAME, stats.TOO_FEW)), (
                history.id.name, run)
            assert mine.cost_changes == theirs.cost_changes
            assert [r.run_id for r in view.row.history] == [r.run_id for r in row.history]
            if theirs.timing is not None:
                assert mine.timing.ratio == theirs.timing.ratio
                if mine.timing.low is not None:  # computed: the very same CI
                    assert (mine.timing.low, mine.timing.high) == (theirs.timing.low,
                                                                   theirs.timing.high)
            checked += 1
    # every arm's timed and plan runs after the first of each key were compared
    assert checked > len(ARMS) * NIGHTS * 2 * 0.8


def test_planted_events_get_their_verdicts(histories):
    events = synthetic.events(NIGHTS)
    slow = events[0]  # engine +12% and +8% bytes from night 10 to 12
    engine = histories["engine"].timed
    assert engine[slow.start].verdict == REGRESSED
    assert "slower" in engine[slow.start].why and "bytes_accessed_per_step" in (
        engine[slow.start].why)
    # on the regression's point, what differs: the loop fusions' extra pass, named first
    assert "what differs: fusion: loop +1 runs, +" in engine[slow.start].why
    assert "what differs:" not in engine[slow.start - 1].why
    assert engine[slow.start - 1].verdict == OK
    # The fix is exact in cost (bytes back down), the timing is faster than the slow runs.
    assert engine[slow.end].verdict in (OK, IMPROVED)
    assert engine[slow.end].comparison.cost_changes[0].new < (
        engine[slow.end].comparison.cost_changes[0].old)
    oom = histories["peft-maxtext"].timed[events[2].start]
    assert oom.verdict == BROKEN and oom.why.startswith("oom: RESOURCE_EXHAUSTED")
    assert oom.median is None


def test_an_environment_change_starts_a_new_baseline_and_is_named(histories):
    native = histories["native"]
    libtpu, jax = synthetic.events(NIGHTS)[3:5]
    first_after = native.timed[libtpu.start]
    assert first_after.verdict == NOT_COMPARABLE
    assert "libtpu 0.0.31 -> 0.0.32" in first_after.why
    assert native.timed[libtpu.start + 1].verdict in (OK, IMPROVED, REGRESSED)
    after_jax = native.timed[jax.start]
    assert after_jax.verdict == NOT_COMPARABLE and "jax 0.11.2 -> 0.12.0" in after_jax.why
    assert native.timed[0].why == "first run: no history"
    texts = [c.text for c in native.changes]
    # one marker per change, shared by the timed and plan runs of that night
    assert sum("libtpu 0.0.31 -> 0.0.32" in t for t in texts) == 1
    assert any("xla_flags" in t for t in texts)
    # plans compile under mimalloc, timed runs not: no marker, as no plan figure changes
    assert not any("host_malloc" in t for t in texts)


def test_medians_and_cis_are_the_medians_modules(histories):
    view = histories["native"].timed[-1]
    expected = medians.median_ci([r.timing.step_ms for r in view.records])
    assert view.median == expected
    assert view.median.low < view.median.median < view.median.high


def test_timed_and_plan_runs_are_kept_apart(records, histories):
    native = histories["native"]
    assert len(native.timed) == len(native.plans) == NIGHTS
    assert all(kind(r) == "plan" for v in native.plans for r in v.records)
    assert {v.verdict for v in native.plans} <= {OK, REGRESSED, NOT_COMPARABLE}


def test_skipping_the_ci_never_changes_slower_or_faster():
    """compare(..., full_ci=False) skips the bootstrap only where the ratio alone settles
    that it is neither slower nor faster, and then says so: within the minimum effect."""
    import numpy as np

    rng = np.random.default_rng(3)
    for shift in np.linspace(-0.12, 0.12, 25):
        old = [100 * (1 + rng.normal(0, 0.01)) * (1 + rng.normal(0, 0.02, 20))
               for _ in range(8)]
        new = [100 * (1 + shift) * (1 + rng.normal(0, 0.01)) * (1 + rng.normal(0, 0.02, 20))
               for _ in range(4)]
        full = stats.compare(old, new, resamples=2000, min_effect=0.05)
        quick = stats.compare(old, new, resamples=2000, min_effect=0.05, full_ci=False)
        assert quick.ratio == full.ratio
        assert (quick.low is None) == (0.95 < full.ratio < 1.05)
        if quick.low is not None:
            assert dataclasses.asdict(quick) == dataclasses.asdict(full)
            assert stats.verdict(quick) == stats.verdict(full), shift
        else:
            assert stats.verdict(quick) == stats.WITHIN
            assert stats.label(quick) == "within the 5% minimum effect (CI not computed)"
            assert stats.verdict(full) not in (stats.SLOWER, stats.FASTER), shift


def test_a_timed_allocator_change_is_marked_once():
    """Timed runs are keyed by their allocator: a change of it starts a new baseline and is
    one marker; plans (keyed without it) are not told apart by it."""
    records = synthetic.nightly_history(nights=4, arms=("native",), presets=("qwen3-8b",),
                                        gas=(4,), seed=3, steps=STEPS)
    last = max(r.run_id for r in records if not r.run.plan_target)
    for r in records:
        if r.run_id == last:
            r.environment = dataclasses.replace(r.environment, host_malloc="MALLOC_ARENA_MAX=1")
    (history,) = (cell_history(cid, group, threshold=0.05)
                  for cid, group in by_cell(records).items())
    texts = [c.text for c in history.changes]
    assert sum("host_malloc (none) -> 'MALLOC_ARENA_MAX=1'" in t for t in texts) == 1, texts
    assert history.timed[-1].verdict == NOT_COMPARABLE
    assert "host_malloc" in history.timed[-1].why
