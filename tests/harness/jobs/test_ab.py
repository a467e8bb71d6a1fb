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


def test_every_side_times_the_trainer_s_own_program():
    """Every cell sends `capture` False (a worker of protocol 3 would build the gradient
    capture into its step where it is True, or missing); a ref whose worker always builds it
    (protocol < 3) is refused: the two sides would time different work."""
    import json
    from types import SimpleNamespace

    from harness.contract import cell_json
    from harness.grid.expand import expand
    from harness.jobs.ab import check_times_trainer, side_tasks
    from tests.harness.orchestrator.test_loop import TINY

    grid = SimpleNamespace(cells=expand({**TINY, "arms": ["native"]}), rounds=2)
    sinks = {side: SimpleNamespace(run_id=side) for side in "AB"}
    tasks = side_tasks(grid, sinks, lockstep=False)
    assert len(tasks) == 4
    assert {json.loads(cell_json(slot.cell))["capture"] for task in tasks for slot in task} == {
        False}

    def ref(version):
        return SimpleNamespace(sha="0123456789ab", protocol=SimpleNamespace(version=version))

    check_times_trainer({"A": ref(3), "B": ref(4)})
    with pytest.raises(ValueError, match=r"A \(0123456789\) times its steps with the gradient "
                                         r"capture chained in \(its worker speaks protocol 2\)"):
        check_times_trainer({"A": ref(2), "B": ref(4)})