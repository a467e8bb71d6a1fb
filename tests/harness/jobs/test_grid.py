"""harness.jobs.grid: arms this environment cannot run, refused where named on the command
line and set aside (then recorded as not run here) where a suite or the default named them;
and `parity arms`."""

import pytest

from harness.grid.expand import expand
from harness.jobs.grid import arm_table, set_aside_unavailable
from tests.arms.test_requirements import TPU_HOST
from tests.harness.cli_helpers import parity_cli


def test_an_arm_named_explicitly_that_cannot_run_is_refused_with_one_line():
    options = {"arms": ["native", "maxtext-engine"]}
    with pytest.raises(ValueError) as refused:
        set_aside_unavailable(options, named=["native", "maxtext-engine"], found=TPU_HOST)
    assert str(refused.value).startswith(
        "arm maxtext-engine cannot run in this environment: maxtext not installed (>=0.2.5 "
        "needed)")
    assert "\n" not in str(refused.value)


def test_arms_a_suite_named_that_cannot_run_are_set_aside_with_why():
    options = {"arms": ["engine", "peft-maxtext", "native", "maxtext-engine"], "seq": [16]}
    kept = set_aside_unavailable(options, found=TPU_HOST)
    assert kept["arms"] == ["engine", "native"] and kept["seq"] == [16]
    assert set(kept["unavailable"]) == {"peft-maxtext", "maxtext-engine"}
    assert kept["unavailable"]["peft-maxtext"] == "maxtext not installed (>=0.2.5 needed)"
    assert set_aside_unavailable(options) == options  # here (the lock): every arm runs
    with pytest.raises(ValueError, match="no arm of the grid can run in this environment"):
        set_aside_unavailable({"arms": ["maxtext-engine"]}, found=TPU_HOST)


def test_parity_arms_lists_every_arm_and_what_it_needs():
    assert "| maxtext-engine | MaxText's MaxTextTrainingEngine | the real MaxText Qwen3 " \
           "(maxtext) | no: maxtext not installed" in arm_table(TPU_HOST)
    done = parity_cli("arms")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 7 and all(r.endswith("| yes |") or "| no: " in r for r in rows)
    assert "| native | one jitted step (the straightforward way) |" in done.stdout


def test_a_resumed_grid_counts_only_its_own_slots_among_the_run_ids_records(tmp_path,
                                                                            monkeypatch):
    """A run id's file may hold other shapes and arms (the chip's sessions run one shape a
    call into one id): the count a resumed run skips, and its progress total, are this
    grid's slots only: counting every record under the id made totals such as "[1/-8]"."""
    import harness.jobs.grid as grid_module
    from harness.contract import cell_hash
    from harness.jobs.grid import Grid, Request
    from harness.store import results
    from reports.record import Failure, Record

    cpu = {"backend": "cpu", "device_count": 1, "device_kind": "cpu"}
    monkeypatch.setattr(grid_module, "cell_environment", lambda *a, **k: ({}, dict(cpu)))
    options = {"preset": "tiny", "batch": 4, "steps": 2, "warmup": 1, "rounds": 2,
               "arms": ["native"], "seq": [16]}
    grid = Grid(Request(explicit={}, out=tmp_path), options, run_id="r")
    (mine,) = grid.cells
    other_shape = expand({**options, "seq": [32]})[0]
    other_arm = expand({**options, "arms": ["engine"]})[0]
    for cell, round_index, run_id in [(mine, 0, "r"), (other_shape, 0, "r"),
                                      (other_shape, 1, "r"), (other_arm, 0, "r"),
                                      (mine, 1, "elsewhere")]:
        results.append(grid.path, Record(
            status="failed", error=Failure(reason="crash", message="a cell that ended"),
            arm=cell.arm, round=round_index, config_hash=cell_hash(cell.spec), run_id=run_id))
    assert grid.recorded() == 1
