"""reports.cause: movers are what differs; a cause is named only where one intervention
separates the two sides and the time moved (slower or faster by the one statistics rule)."""

import dataclasses

import numpy as np

from reports import cause, stats
from tests.reports.helpers import fixture_records


def _native():
    return next(r for r in fixture_records(("native",)) if r.ok)


def test_every_difference_of_two_setups_is_named_once():
    a = _native()
    assert cause.interventions(a, a) == []
    b = dataclasses.replace(
        a, arm="engine-no-state-cache",
        spec=dataclasses.replace(a.spec, scan_layers=not a.spec.scan_layers),
        environment=dataclasses.replace(
            a.environment, git_sha="b" * 40,
            versions={**a.environment.versions, "flax": "0.13.0", "jax": "0.12.0"}))
    found = cause.interventions(a, b)
    assert found[0] == f"the commit {(a.environment.git_sha or '?')[:10]} -> bbbbbbbbbb"
    # the software stack is one change, however many of its versions moved
    assert found[1] == (f"the software stack (flax {a.environment.versions['flax']} -> 0.13.0, "
                        f"jax {a.environment.versions['jax']} -> 0.12.0)")
    assert found[2:] == ["the arm native -> engine-no-state-cache",
                         f"the option scan_layers {a.spec.scan_layers} -> "
                         f"{not a.spec.scan_layers}"]
    # what a comparison does not control is named too
    moved = dataclasses.replace(a, environment=dataclasses.replace(
        a.environment, host="elsewhere", git_dirty=True))
    assert cause.interventions(a, moved) == [f"host {a.environment.host} -> elsewhere",
                                             "uncommitted changes on side B"]


def _timing(scale):
    rng = np.random.default_rng(0)
    side = [[100 * scale * (1 + rng.normal(0, 0.001)) for _ in range(20)] for _ in range(6)]
    base = [[100 * (1 + rng.normal(0, 0.001)) for _ in range(20)] for _ in range(6)]
    return stats.compare(base, side)


def test_a_cause_is_named_only_from_one_intervention_that_moved_the_time():
    slower, same = _timing(1.2), _timing(1.0)
    arm = ["the arm engine -> engine-no-state-cache"]
    assert cause.cause(slower, arm) == (
        f"**Cause**: the arm engine -> engine-no-state-cache moved the time: "
        f"{stats.describe(slower)}.")
    assert stats.verdict(slower) == stats.SLOWER
    # the time did not move: the intervention is named, no cause claimed
    assert cause.cause(same, arm).startswith(
        "Cause: none claimed: the arm engine -> engine-no-state-cache did not move the time "
        "beyond noise by the minimum effect (1.0")
    # moved by less than the minimum effect: detected, still no cause
    under = _timing(1.02)
    assert stats.verdict(under) == stats.UNDER
    assert cause.cause(under, arm).startswith("Cause: none claimed:")
    # two changes at once: no single cause, however far the time moved
    two = cause.cause(slower, [*arm, "the option remat none -> full"])
    assert two.startswith("Cause: none claimed: the sides differ in 2 things (the arm")
    # nothing the records name: an A/A, or a change outside them
    assert cause.cause(slower, []).startswith("Cause: none claimed: the records name no "
                                              "difference")
    # no timing on both sides (plans, captures)
    assert cause.cause(None, arm).startswith("Cause: none claimed: the sides carry no timing")
