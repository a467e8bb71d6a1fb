"""Multi-process runs: 2 local processes x 4 CPU devices (gloo) against 1 x 8 devices."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reports.record import read, read_dir

pytestmark = pytest.mark.slow  # ~1 min: several multi-process runs

REPO = Path(__file__).resolve().parents[3]
CELL = ["--preset", "tiny", "--seq", "32", "--batch", "16", "--ga", "2", "--ragged", "40,24",
        "--mesh", "fsdp=8", "--steps", "3", "--warmup", "1", "--timeout", "240"]


def _env():
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    return env


def _run(args, out, timeout=600):
    proc = subprocess.run([sys.executable, "-m", "harness.cli", *args, "--out", str(out)],
                          env=_env(), capture_output=True, text=True, timeout=timeout)
    return proc


def test_two_processes_equal_one_process_with_eight_devices(tmp_path):
    single = _run(["run", "--arms", "engine", *CELL, "--cpu-devices", "8"], tmp_path / "one")
    assert single.returncode == 0, single.stdout + single.stderr
    # No --mesh: a multi-process run's default mesh spans every process's devices.
    no_mesh = [a for a in CELL if a not in ("--mesh", "fsdp=8")]
    multi = _run(["launch", "-n", "2", "--", "--arms", "engine", *no_mesh, "--cpu-devices",
                  "4"], tmp_path / "two")
    assert multi.returncode == 0, multi.stdout + multi.stderr
    (one,) = read_dir(tmp_path / "one")
    files = list((tmp_path / "two").glob("*.jsonl"))
    assert len(files) == 1
    (two,) = read(files[0])  # one record, written by process 0 only
    assert two.ok, two.error
    assert two.environment.process_count == 2 and two.environment.device_count == 8
    assert two.spec.mesh == "fsdp=-1" and one.spec.mesh == "fsdp=8"
    assert one.environment.process_count == 1 and one.environment.device_count == 8
    assert [h.process for h in two.memory.hosts] == [0, 1]
    assert all(h.rss_delta_bytes is not None for h in two.memory.hosts)
    p1, p2 = one.parity, two.parity
    assert p1.data_digest == p2.data_digest
    assert abs(p2.loss - p1.loss) <= 1e-5 * abs(p1.loss)
    # Both captured gradients are within 5e-6 of the same exact gradient, so (triangle
    # inequality) they are within 1e-5 of each other relative to its norm.
    assert p1.rel_l2 <= 5e-6 and p2.rel_l2 <= 5e-6
    assert abs(p2.grad_l2 - p1.grad_l2) <= 1e-5 * p1.grad_l2


def test_a_dead_process_fails_the_cell_instead_of_hanging(tmp_path):
    proc = _run(["launch", "-n", "2", "--", "--arms", "test-die-1", "--plugin",
                 "tests.harness.fault_arms", *CELL[:-2], "--timeout", "90",
                 "--cpu-devices", "4", "--no-parity"], tmp_path, timeout=300)
    assert proc.returncode != 0
    (record,) = read_dir(tmp_path)
    assert record.status == "failed"
    assert record.error.reason == "peer-died", record.error
