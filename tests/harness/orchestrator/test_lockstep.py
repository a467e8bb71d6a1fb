"""Lockstep (harness.orchestrator.lockstep): two real worker processes of one cell alive side
by side, each timing a slice only when the parent says, the slice pairs compared."""

import dataclasses
import json
import socket
import subprocess
from pathlib import Path

import pytest

from arms.spec import CellSpec
from harness.contract import DONE, GO, READY, CellRun, cell_json, worker_args
from harness.jobs import ab
from harness.orchestrator import spawn
from harness.orchestrator.environment import cpu_env
from harness.orchestrator.lockstep import LockstepPairs
from harness.orchestrator.loop import Sink, Slot, stamp
from harness.orchestrator.refs import LOCKSTEP_COMMIT, Ref, protocol_of
from harness.store.layout import RunStore
from reports.compare import compare_sets
from reports.record import Record

REPO = Path(__file__).resolve().parents[3]
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


def _gated(out: Path, fd: int) -> list[str]:
    return worker_args(f"[{cell_json(CELL)}]", str(out), slices=3, gate_fd=fd)


def test_a_gated_worker_times_a_slice_only_when_told(tmp_path):
    ours, theirs = socket.socketpair()
    out = tmp_path / "records.json"
    with ours, spawn.started_worker(_gated(out, theirs.fileno()), cpu_env(1),
                                    tmp_path / "stderr.txt", None,
                                    pass_fds=[theirs.fileno()]) as proc:
        theirs.close()
        assert _recv(ours, 300) == READY, (tmp_path / "stderr.txt").read_text()
        for _ in range(3):
            assert _recv(ours, NO_GO_S) is None  # ready, waiting: nothing is timed
            ours.sendall(GO)
            assert _recv(ours, 60) == DONE
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
    with spawn.started_worker(_gated(out, theirs.fileno()), cpu_env(1),
                              tmp_path / "stderr.txt", None,
                              pass_fds=[theirs.fileno()]) as proc:
        theirs.close()
        with ours:
            assert _recv(ours, 300) == READY
        proc.wait(timeout=120)
    (record,) = json.loads(out.read_text())
    assert record["status"] == "failed"
    assert "closed the gate before the last slice" in record["error"]["message"]


def _sinks(tmp_path: Path, envs: dict[str, dict]) -> dict[str, Sink]:
    found = {}
    for side, env in envs.items():
        (tmp_path / side).mkdir()
        found[side] = Sink(path=tmp_path / f"{side}.jsonl", run_id=f"ab-{side}",
                           store=RunStore(tmp_path / side), env=env)
    return found


@pytest.mark.slow  # four worker processes
def test_a_lockstep_pair_records_both_sides_and_compares_their_slice_pairs(tmp_path):
    sinks = _sinks(tmp_path, {"A": cpu_env(1), "B": cpu_env(1)})
    pairs = LockstepPairs(timeout_s=300, slices=3)
    rounds = []
    for k, first in enumerate(("A", "B")):  # two rounds, each side first once
        slots = tuple(Slot(CELL, k, 0, sinks[side]) for side in (first, "AB".replace(first, "")))
        found = pairs.run(k, slots)
        for slot, record in zip(slots, found, strict=True):
            assert record.ok, record.error
            assert record.timing.slices == [2, 2, 2]
            stamp(record, slot, pairs.pairing(slots))
        rounds.append({r.run_id[-1]: r for r in found})
    assert rounds[0]["A"].run.pairing == ["lockstep"]
    (row,) = compare_sets([r["A"] for r in rounds], [r["B"] for r in rounds], paired=True)
    # Slice pairs are the unit: 2 rounds x 3 slices (rounds alone would be 2 runs a side).
    assert row.timing.paired and row.timing.runs_old == row.timing.runs_new == 6
    assert row.timing.min_steps == 6


def test_a_side_that_dies_fails_alone_and_the_other_is_timed(tmp_path):
    broken = {**cpu_env(1), "XLA_FLAGS": "--no_such_xla_flag"}  # XLA aborts at startup
    sinks = _sinks(tmp_path, {"A": cpu_env(1), "B": broken})
    a, b = LockstepPairs(timeout_s=300, slices=3).run(
        0, (Slot(CELL, 0, 0, sinks["A"]), Slot(CELL, 0, 0, sinks["B"])))
    assert a.ok and a.timing.slices == [2, 2, 2]
    assert b.status == "failed" and b.error.reason == "crash"


def test_a_side_the_kernel_oom_kills_is_recorded_oom(tmp_path, monkeypatch):
    """A lockstep worker SIGKILLed while the kernel counts an OOM kill in this cgroup is
    `oom` (the same exit -> record path as every worker's), and the other side is timed.
    The kernel's counter is the one thing stood in for: it moves from 0 to 1 while the pair
    runs, as an OOM kill of the worker would move it."""
    readings = iter([0])
    monkeypatch.setattr(spawn, "oom_kills", lambda: next(readings, 1))
    sinks = _sinks(tmp_path, {"A": cpu_env(1), "B": cpu_env(1)})
    killed = dataclasses.replace(CELL, arm="test-sigkill",
                                 plugins=("tests.harness.fault_arms",))
    a, b = LockstepPairs(timeout_s=300, slices=3).run(
        0, (Slot(CELL, 0, 0, sinks["A"]), Slot(killed, 0, 0, sinks["B"])))
    assert a.ok and a.timing.slices == [2, 2, 2]
    assert b.error.reason == "oom", b.error
    assert "killed by the kernel's OOM killer" in b.error.message


def _commit(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", ref], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_each_refs_worker_says_its_protocol_and_lockstep_refuses_one_without_it(tmp_path):
    """This checkout's worker says its own version; a tree without harness.contract is an
    older commit, whose worker is `harness.worker`: protocol 1 (lockstep) from the commit
    that added lockstep on, 0 before it (read from git's ancestry, not from its source)."""
    ours = protocol_of(REPO, _commit("HEAD"))
    assert (ours.version, ours.worker_module, ours.lockstep) == (4, "harness.cell", True)
    old = tmp_path / "old"
    old.mkdir()
    before, since = _commit(f"{LOCKSTEP_COMMIT}~1"), LOCKSTEP_COMMIT
    assert protocol_of(old, since).version == 1 and protocol_of(old, since).lockstep
    assert protocol_of(old, before).version == 0 and not protocol_of(old, before).lockstep
    assert protocol_of(old, before).worker_module == "harness.worker"
    refs = {"A": Ref("A", "f" * 40, REPO, ours), "B": Ref("B", before, old,
                                                           protocol_of(old, before))}
    with pytest.raises(ValueError, match=rf"B \({before[:10]}\) has no lockstep A/B .* use "
                                         "--pairing processes"):
        ab.check_lockstep(refs)
    ab.check_lockstep({"A": refs["A"], "B": refs["A"]})  # both have it: no error
