"""The results store: records whole or absent (a full disk included), unique run ids, one
writer per results file."""

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.grid.expand import expand
from harness.jobs.run import run_grid
from harness.orchestrator.environment import cpu_env
from harness.orchestrator.loop import Sink, Slot, stamp
from harness.store import results
from harness.store.layout import new_run_id
from reports.record import Failure, Record, ResultsError, read
from tests.harness.cli_helpers import parity_main
from tests.reports.helpers import fixture_records

REPO = Path(__file__).resolve().parents[3]
TINY = {"preset": "tiny", "batch": 4, "steps": 2, "warmup": 1, "parity": False}


def _env():
    env = cpu_env(None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("XLA_FLAGS", None)
    return env


def _record(message: str = "x") -> Record:
    return Record(status="failed", error=Failure(reason="crash", message=message))


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A directory whose filesystem fills up after about one record: a 12 KiB tmpfs where
    this test may mount one (root), else `os.write` in the results store fails with ENOSPC
    after its first record, as a full disk does (a short write first)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = os.geteuid() == 0 and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(mount)],
        capture_output=True).returncode == 0
    if not mounted:
        real_write, calls = os.write, []

        def write(fd, data):
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, data)
            real_write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(results.os, "write", write)
    yield mount
    if mounted:
        subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.slow  # cell processes on a full disk (~11 s)
def test_a_full_disk_loses_one_named_cell_and_leaves_every_line_whole(small_disk):
    cells = expand({**TINY, "arms": ["native"], "seq": [16, 32, 64]})
    with pytest.raises(results.WriteError) as failure:
        run_grid(cells, small_disk, env=_env(), timeout_s=300, run_id="full")
    message = str(failure.value)
    assert "Lost: the record of native tiny seq=32 batch=4 ga=1 round 0" in message
    assert "1 earlier records are kept, 1 cells did not run" in message
    assert "--run-id full: it skips the cells recorded under that id" in message
    path = small_disk / "full.jsonl"
    (kept,) = read(path)  # every line parses: the torn second one was truncated
    assert kept.ok and kept.spec.seq == 16
    assert path.read_bytes().endswith(b"\n")
    results.check_appendable(path)  # a resumed run may append to it
    assert not (small_disk / ".full.jsonl.lock").exists()


def test_a_resumed_run_skips_the_cells_its_file_holds(tmp_path):
    """Rerunning a run's command with its --run-id (what the full-disk message says to do)
    runs only the cells it has no record of: no cell is recorded twice. The first run's
    record of seq 16 is a real run's (the report tests' fixture) stamped as that cell's
    round 0 the way the run loop stamps a worker's record."""
    (first,) = expand({**TINY, "arms": ["native"], "seq": [16]})
    (record, *_) = fixture_records()
    stamp(record, Slot(first, 0, 0, Sink(path=tmp_path / "r.jsonl", run_id="r", store=None,
                                         env={})))
    results.append(tmp_path / "r.jsonl", record)
    both = expand({**TINY, "arms": ["native"], "seq": [16, 32]})
    started = []
    _, records = run_grid(both, tmp_path, env=_env(), timeout_s=300, run_id="r",
                                 on_start=lambda cell, _: started.append(cell.spec["seq"]))
    assert started == [32] and [r.spec.seq for r in records] == [32]
    assert sorted(r.spec.seq for r in read(tmp_path / "r.jsonl")) == [16, 32]


def test_a_disk_full_before_the_run_is_one_line_and_exit_2(tmp_path):
    """On a 100%-full disk the run's first write (its lock's pid) fails: one line, exit 2,
    no record, no lock left. Needs a 4 KiB tmpfs (root); filled to the last page."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "tmpfs",
                                            str(disk)], capture_output=True).returncode:
        pytest.skip("needs root to mount a 4 KiB tmpfs")
    try:
        with (disk / "filler").open("wb", buffering=0) as f, pytest.raises(OSError):
            while True:
                f.write(b"x" * 512)
        proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--arms", "native",
                               "--preset", "tiny", "--seq", "16", "--batch", "4", "--steps",
                               "2", "--warmup", "1", "--out", str(disk / "out"), "--run-id",
                               "r"], env=_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == (
            f"parity: error: cannot write {disk / 'out' / '.r.jsonl.lock'} (No space left on "
            "device); no cell was run and no record written: free space there, or give "
            "another --out")
        assert list((disk / "out").iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_partial_last_line_is_refused_not_glued_onto(tmp_path):
    path = tmp_path / "r.jsonl"
    results.append(path, _record("first"))
    with path.open("a") as f:
        f.write('{"schema": 3, "status": "ok", "cu')  # a writer killed mid-line
    size = path.stat().st_size
    with pytest.raises(results.WriteError, match="ends in a partial line"):
        results.append(path, _record("second"))
    assert path.stat().st_size == size
    with pytest.raises(ValueError, match=r"r.jsonl:2: not valid JSON"):
        results.check_appendable(path)


def test_run_ids_never_repeat_in_a_process_or_across_processes():
    ids = [new_run_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    code = "from harness.store.layout import new_run_id; print(new_run_id('ab-'))"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=_env()) for _ in range(2)]
    others = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert len(set(others)) == 2 and all(o.startswith("ab-") for o in others)
    assert [o.rsplit("-p", 1)[1] for o in others] == [str(p.pid) for p in procs]


def test_two_writers_of_one_results_file_the_second_is_refused(tmp_path):
    cells = expand({**TINY, "arms": ["native"], "seq": 16})
    with results.exclusive(tmp_path / "same.jsonl"), \
            pytest.raises(ValueError, match="being written by another parity process"):
        run_grid(cells, tmp_path, env=_env(), timeout_s=300, run_id="same")
    assert not (tmp_path / "same.jsonl").exists()


def test_the_lock_beside_a_results_file_names_its_holder_and_goes_with_it(tmp_path):
    """The lock beside a results file exists only while its writer runs."""
    path = tmp_path / "r.jsonl"
    with results.exclusive(path):
        assert (tmp_path / ".r.jsonl.lock").read_text() == str(os.getpid())
        with pytest.raises(ValueError, match=rf"being written by another parity process "
                                             rf"\(pid {os.getpid()}\)"), results.exclusive(path):
            pass
    assert list(tmp_path.iterdir()) == []


NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]
"""Runs a command without root's power to write a file its mode forbids (as a user would)."""


def _parity(*args, prefix=()):
    return subprocess.run([*prefix, sys.executable, "-m", "harness.cli", *args], env=_env(),
                          capture_output=True, text=True, timeout=300)


def test_paths_a_run_writes_are_checked_before_any_cell(tmp_path, capsys):
    """A read-only results file, a traces path that is a file and a results file name that
    is a directory each fail before any process starts: one line, exit 2, nothing written."""
    cell = ["--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4", "--steps",
            "2", "--warmup", "1"]
    out = tmp_path / "X"
    out.mkdir()
    keep = out / "keep.jsonl"
    keep.write_text("")
    keep.chmod(0o444)
    proc = _parity("run", *cell, "--out", str(out), "--run-id", "keep", prefix=NO_DAC)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"parity: error: {keep}: cannot append to it (Permission "
                                   "denied); make it writable, or give another --run-id or --out")
    (out / "traces").write_text("")  # the rest in this process (tests/harness/cli_helpers)
    proc = parity_main(capsys, "run", *cell, "--trace", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"parity: error: --trace: the traces directory "
                                   f"{out / 'traces'} is a file; give a directory")
    (out / "x.jsonl").mkdir()
    is_dir = (f"parity: error: {out / 'x.jsonl'} is a directory, not a results file; rename or "
              "remove it (results files are the *.jsonl files of --out)")
    for args in (["run", *cell, "--out", str(out), "--run-id", "x"],
                 ["report", str(out), "-o", str(tmp_path / "r.md")],
                 ["compare", str(out), str(out)]):
        proc = parity_main(capsys, *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.strip() == is_dir, args
    assert sorted(p.name for p in out.iterdir()) == ["keep.jsonl", "traces", "x.jsonl"]
    assert not (tmp_path / "r.md").exists()


def test_a_results_line_that_is_not_utf8_names_its_file_and_line(tmp_path):
    path = tmp_path / "r.jsonl"
    results.append(path, _record("first"))
    with path.open("ab") as f:
        f.write(b'{"schema": 3, "status": "ok\xff"}\n')
    with pytest.raises(ResultsError, match=r"r.jsonl:2: not UTF-8 text \(byte 27\)"):
        read(path)
