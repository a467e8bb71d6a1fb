"""harness.jobs.ab: how A's and B's processes share the machine, by backend: side by side
in lockstep on the CPU; one after the other on an accelerator, whose chips one process at a
time holds."""

import pytest

from harness.contract import LOCKSTEP, PROCESSES
from harness.jobs.ab import pairing_for, precheck


def test_the_default_pairing_is_lockstep_on_cpu_and_processes_on_an_accelerator():
    assert pairing_for({"backend": "cpu"}, None) == LOCKSTEP
    for accelerator in ("tpu", "gpu"):
        assert pairing_for({"backend": accelerator}, None) == PROCESSES
        assert pairing_for({"backend": accelerator}, PROCESSES) == PROCESSES
        with pytest.raises(ValueError, match=f"--pairing lockstep runs A's and B's processes "
                                             f"side by side, and on this {accelerator} host "
                                             "one process at a time holds the accelerator"):
            pairing_for({"backend": accelerator}, LOCKSTEP)
    assert pairing_for({"backend": "cpu"}, PROCESSES) == PROCESSES


def test_rounds_that_suit_no_pairing_are_refused_before_the_device_is_probed():
    """Left to the backend, values that suit neither pairing fail at once (as lockstep's,
    the CPU's default); values that suit one wait for the probe to say which."""
    with pytest.raises(ValueError, match="--rounds 1 with --slices 5: lockstep"):
        precheck({"rounds": 1, "steps": 10}, None, 5)
    precheck({"rounds": 8, "steps": 10}, None, 3)  # processes would take it: not refused yet
    with pytest.raises(ValueError, match="--slices 3 with --steps 10"):
        precheck({"rounds": 8, "steps": 10}, LOCKSTEP, 3)
    with pytest.raises(ValueError, match="--rounds 3: A/B needs at least 6 rounds"):
        precheck({"rounds": 3, "steps": 10}, PROCESSES, 5)


def test_both_sides_build_the_capture_where_one_worker_always_does():
    """A --no-parity A/B runs the trainers' own programs (no gradient capture), except
    against a worker of protocol < 3, which always builds the capture: then both sides do,
    so that the two time the same work."""
    from types import SimpleNamespace

    from harness.grid.expand import expand
    from harness.jobs.ab import side_tasks
    from tests.harness.orchestrator.test_loop import TINY

    grid = SimpleNamespace(cells=expand({**TINY, "arms": ["native"], "parity": False}),
                           rounds=2)
    sinks = {side: SimpleNamespace(run_id=side) for side in "AB"}

    def captures(protocols):
        tasks = side_tasks(grid, sinks, lockstep=False, protocols=protocols)
        return {slot.cell.capture for task in tasks for slot in task}

    assert captures({"A": 3, "B": 3}) == {False}
    assert captures({"A": 2, "B": 3}) == {True}
