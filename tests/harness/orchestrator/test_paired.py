"""In-process pairing (`parity run --pairing in-process`): which arms may share a process,
and a real paired run's records, read back by the report as slice pairs."""

import dataclasses
import itertools
import json

import pytest

from arms.spec import CellSpec
from harness.contract import CellRun, slice_order
from harness.grid.options import check_pairable
from harness.orchestrator import spawn
from harness.orchestrator.environment import cpu_env
from harness.orchestrator.executors import PairedProcesses, groups
from harness.orchestrator.loop import Sink, Slot
from harness.store.layout import RunStore
from reports.frame import to_frame
from reports.record import read_dir
from reports.tables import speedup
from tests.harness.cli_helpers import parity_cli

CELL = ["--preset", "tiny", "--seq", "16", "--batch", "4", "--ga", "2", "--warmup", "1",
        "--plugin", "tests.harness.fault_arms"]


def test_only_arms_that_leave_no_process_state_pair():
    check_pairable(["engine", "engine-fused", "native"], 16, 8)
    with pytest.raises(ValueError) as refused:
        check_pairable(["native", "peft-decoder", "maxtext-engine", "engine:tunix"], 16, 8)
    reasons = str(refused.value).split(": ", 1)[1].split("; ")
    assert [line.split(":")[0] for line in reasons] == [
        "peft-decoder", "maxtext-engine", "engine"]
    assert "flax_always_shard_variable" in reasons[0] and "pyconfig" in reasons[1]
    with pytest.raises(ValueError, match="cannot put these arms in one process: "
                                         "peft-decoder: Tunix's PeftTrainer"):
        check_pairable(["native", "peft-decoder"], 16, 8)
    with pytest.raises(ValueError, match="needs at least two arms"):
        check_pairable(["native"], 16, 8)
    with pytest.raises(ValueError, match="--slices 3 with --steps 16"):
        check_pairable(["native", "engine"], 16, 3)


def test_every_arm_takes_every_place_and_none_runs_twice_in_a_row():
    orders = [slice_order(3, i) for i in range(6)]
    assert orders[:3] == [[0, 1, 2], [1, 2, 0], [2, 0, 1]]
    for arm in range(3):
        assert sorted(order.index(arm) for order in orders) == [0, 0, 1, 1, 2, 2]
    sequence = [k for order in orders for k in order]
    assert all(a != b for a, b in itertools.pairwise(sequence))


def test_cells_group_by_shape_keeping_the_arm_order():
    a = [CellRun(arm=arm, spec={"seq": seq}) for seq in (16, 32) for arm in ("native", "engine")]
    assert [[(c.arm, c.spec["seq"]) for c in g] for g in groups(a)] == [
        [("native", 16), ("engine", 16)], [("native", 32), ("engine", 32)]]


def test_a_refused_pairing_exits_2_before_any_cell(tmp_path):
    proc = parity_cli("run", "--pairing", "in-process", "--arms", "native,peft-decoder", *CELL,
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "parity: error: --pairing in-process cannot put these arms in one process" in (
        proc.stderr)
    assert not list((tmp_path / "out").glob("*.jsonl"))


@pytest.mark.slow
def test_a_paired_run_records_slices_and_the_report_compares_slice_pairs(tmp_path):
    out = tmp_path / "out"
    command = ["run", "--pairing", "in-process", "--arms", "native,test-spin", *CELL,
               "--steps", "12", "--slices", "4", "--out", str(out), "--run-id", "paired"]
    proc = parity_cli(*command, "--rounds", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The same run resumed with more rounds runs only the process it has no records of.
    proc = parity_cli(*command, "--rounds", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("start") == 2, proc.stdout  # the two arms of round 1
    records = read_dir(out)
    assert [(r.arm, r.round) for r in records] == [
        ("native", 0), ("test-spin", 0), ("native", 1), ("test-spin", 1)]
    for record in records:
        assert record.run.pairing == ["native", "test-spin"]
        assert record.timing.slices == [3, 3, 3, 3] and len(record.timing.step_ms) == 12
        assert record.timing.executions_per_step == 1
    # Parity is checked in the first process only, for each arm, against the exact reference.
    assert [r.parity is not None for r in records] == [True, True, False, False]
    assert all(r.parity.rel_l2 <= 1e-5 for r in records[:2])  # GRAD_TOLERANCE
    frame = to_frame(records)
    native = frame[frame["arm"] == "native"].iloc[0]
    assert [len(p) for p in native["slices"]] == [4, 4]
    c = speedup(frame, native, "test-spin")
    assert c.paired and c.runs_old == 8 and c.min_steps == 12
    # A paired run is its own kind of sample: not pooled with a run of separate processes.
    assert json.loads(json.dumps(records[0].to_json()))["run"]["pairing"] == [
        "native", "test-spin"]


def test_a_paired_process_the_kernel_oom_kills_records_oom_for_every_arm(tmp_path,
                                                                        monkeypatch):
    """A paired worker SIGKILLed while the kernel counts an OOM kill in this cgroup: every
    arm of the process is `oom`, as a cell of its own would be (one exit -> record path).
    The kernel's counter is the one thing stood in for: it moves from 0 to 1 while the
    process runs, as an OOM kill of the worker would move it."""
    readings = iter([0])
    monkeypatch.setattr(spawn, "oom_kills", lambda: next(readings, 1))
    spec = CellSpec(preset="tiny", seq=16, batch=4).to_dict()
    cells = [CellRun(arm=arm, spec=spec, steps=4, warmup=1, parity=False,
                     plugins=("tests.harness.fault_arms",)) for arm in ("test-same",
                                                                        "test-sigkill")]
    sink = Sink(path=tmp_path / "r.jsonl", run_id="r", store=RunStore(tmp_path), env=cpu_env(1))
    records = PairedProcesses(timeout_s=300, slices=2).run(
        0, tuple(Slot(cell, 0, k, sink) for k, cell in enumerate(cells)))
    assert [r.error.reason for r in records] == ["oom", "oom"], [r.error for r in records]
    assert all("killed by the kernel's OOM killer" in r.error.message for r in records)
    assert dataclasses.replace(records[0].error) == records[1].error
