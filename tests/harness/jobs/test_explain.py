"""harness.jobs.explain.what_changed: the block under each regression, from records alone."""

import dataclasses

from harness.jobs.explain import what_changed
from reports.compare import compare_sets
from reports.record import Failure
from tests.reports.helpers import fixture_records


def test_a_cell_that_failed_on_the_new_side_is_explained_as_having_nothing_to_compare():
    old = fixture_records(("native",))
    new = [dataclasses.replace(r, status="failed", timing=None, memory=None, cost=None,
                               parity=None, trace=None,
                               error=Failure(reason="crash", message="injected"))
           for r in old]
    rows = compare_sets(old, new)
    text = what_changed(rows)
    assert text.count("### What differs: native") == len({r.name for r in rows})
    assert "One side has no finished run to compare (its failure is above)." in text
    assert what_changed(compare_sets(old, old)) == ""  # no regression, no block


def _rounds(arm: str, median_ms: float):
    from tests.reports.helpers import with_rounds

    record = next(r for r in fixture_records(("native",)) if r.ok)
    return with_rounds(dataclasses.replace(record, arm=arm), median_ms)


def test_explain_names_the_one_intervention_that_moved_the_time_as_the_cause():
    """`parity explain`'s cause line: the two records' one difference (here the arm: an
    ablation arm against its engine) is the cause where their cells' rounds (6 a side,
    compared as interleaved pairs) say slower; the same arm at the same time is not."""
    from harness.jobs.explain import cause_line

    engine = _rounds("engine", 10.0)
    ablated = _rounds("engine-no-state-cache", 15.0)
    line = cause_line([(engine, engine[0]), (ablated, ablated[0])])
    assert line.startswith("**Cause**: the arm engine -> engine-no-state-cache moved the "
                           "time: 1.5") and line.endswith(": slower.")
    level = _rounds("engine-no-state-cache", 10.0)
    assert cause_line([(engine, engine[0]), (level, level[0])]).startswith(
        "Cause: none claimed: the arm engine -> engine-no-state-cache did not move the time")
    # a capture has no record to name an intervention or carry a time
    assert cause_line([(None, None), (ablated, ablated[0])]).startswith(
        "Cause: none claimed: the sides carry no timing")


def test_the_block_under_a_regression_says_what_differs_then_its_cause():
    old = _rounds("native", 10.0)
    new = [dataclasses.replace(r, run_id="later") for r in _rounds("native", 20.0)]
    (row,) = compare_sets(old, new)
    text = what_changed([row])
    assert text.startswith("### What differs: native")
    assert "Movers are what differs between the two sides' programs" in text
    # the two runs' records name no difference: no cause, though the time doubled
    assert text.rstrip().endswith("(an A/A, or what differs is outside what they record); "
                                  f"the time: {row.timing.ratio:.3f} [{row.timing.low:.3f}, "
                                  f"{row.timing.high:.3f}]: slower.")
