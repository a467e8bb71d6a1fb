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
    assert text.count("### What changed: native") == len({r.name for r in rows})
    assert "One side has no finished run to compare (its failure is above)." in text
    assert what_changed(compare_sets(old, old)) == ""  # no regression, no block
