"""Lockstep A/B (harness.lockstep): two real worker processes of one cell alive side by
side, each timing a slice only when the parent says, the slice pairs compared."""

import json
import socket
from pathlib import Path

import pytest

from arms.spec import CellSpec
from harness import ab, lockstep
from harness.runner import cell_json, cpu_env, stamp, started_worker
from harness.worker import CellRun
from reports.compare import compare_sets
from reports.record import Record

CELL = CellRun(arm="native", spec=CellSpec(preset="tiny", seq=16, batch=4).to_dict(),
               steps=6, warmup=1, parity=False)
NO_GO_S = 1.0
"""How long a ready worker is left without GO: a tiny native slice takes milliseconds, so a
worker that timed without waiting would have said DONE many times over."""


def _recv(sock: socket.socket, timeout_s: float) -> bytes | None:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1)
    except TimeoutError:
        return None


def test_a_gated_worker_times_a_slice_only_when_told(tmp_path):
    ours, theirs = socket.socketpair()
    out = tmp_path / "records.json"
    with ours, started_worker(lockstep.worker_args(cell_json(CELL), 3, out, theirs.fileno()),
                              cpu_env(1), tmp_path / "stderr.txt", None,
                              pass_fds=[theirs.fileno()]) as proc:
        theirs.close()
        assert _recv(ours, 300) == lockstep.READY, (tmp_path / "stderr.txt").read_text()
        for _ in range(3):
            assert _recv(ours, NO_GO_S) is None  # ready, waiting: nothing is timed
            ours.sendall(lockstep.GO)
            assert _recv(ours, 60) == lockstep.DONE
        # Done with its slices, it waits for the pair to end before its record: what it
        # does next must not run beside the other side's last slice.
        assert _recv(ours, NO_GO_S) is None and proc.poll() is None and not out.exists()
        ours.close()
        proc.wait(timeout=120)
    assert proc.returncode == 0, (tmp_path / "stderr.txt").read_text()
    (record,) = [Record.from_json(d, "test", whole=False) for d in json.loads(out.read_text())]
    assert record.ok and record.timing.slices == [2, 2, 2] and len(record.timing.step_ms) == 6


def test_a_worker_whose_parent_leaves_fails_its_record_instead_of_hanging(tmp_path):
    ours, theirs = socket.socketpair()
    out = tmp_path / "records.json"
    with started_worker(lockstep.worker_args(cell_json(CELL), 3, out, theirs.fileno()),
                        cpu_env(1), tmp_path / "stderr.txt", None,
                        pass_fds=[theirs.fileno()]) as proc:
        theirs.close()
        with ours:
            assert _recv(ours, 300) == lockstep.READY
        proc.wait(timeout=120)
    (record,) = json.loads(out.read_text())
    assert record["status"] == "failed"
    assert "closed the gate before the last slice" in record["error"]["message"]


@pytest.mark.slow  # four worker processes
def test_a_lockstep_pair_records_both_sides_and_compares_their_slice_pairs(tmp_path):
    env = cpu_env(1)
    rounds = []
    for first in ("A", "B"):  # two rounds, each side first once
        sides = {side: (env, None) for side in (first, "B" if first == "A" else "A")}
        rounds.append(lockstep.run_pair(CELL, 3, sides, timeout_s=300))
    for found in rounds:
        for record in found.values():
            assert record.ok, record.error
            assert record.timing.slices == [2, 2, 2]
    for k, found in enumerate(rounds):
        for side, record in found.items():
            stamp(record, CELL, run_id=f"ab-{side}", suite=None, round_index=k, env=env,
                  environment=None)
    (row,) = compare_sets([r["A"] for r in rounds], [r["B"] for r in rounds], paired=True)
    # Slice pairs are the unit: 2 rounds x 3 slices (rounds alone would be 2 runs a side).
    assert row.timing.paired and row.timing.runs_old == row.timing.runs_new == 6
    assert row.timing.min_steps == 6


def test_a_side_that_dies_fails_alone_and_the_other_is_timed(tmp_path):
    broken = {**cpu_env(1), "XLA_FLAGS": "--no_such_xla_flag"}  # XLA aborts at startup
    found = lockstep.run_pair(CELL, 3, {"A": (cpu_env(1), None), "B": (broken, None)},
                              timeout_s=300)
    assert found["A"].ok and found["A"].timing.slices == [2, 2, 2]
    assert found["B"].status == "failed" and found["B"].error.reason == "crash"


def test_lockstep_refuses_a_ref_whose_worker_has_no_gate(tmp_path):
    old = tmp_path / "old" / "harness"
    old.mkdir(parents=True)
    (old / "worker.py").write_text("# a worker from before lockstep\n")
    new = Path(__file__).resolve().parents[2]
    shas = {"A": "f" * 40, "B": "0123456789abcdef"}
    ab.check_lockstep({"A": new, "B": new}, shas)  # both have it: no error
    with pytest.raises(ValueError, match=r"B \(0123456789\) predates lockstep A/B .* use "
                                         "--pairing processes"):
        ab.check_lockstep({"A": new, "B": tmp_path / "old"}, shas)
