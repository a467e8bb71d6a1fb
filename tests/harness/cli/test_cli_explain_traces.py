"""`parity explain` of two captures: the command over harness.measure.trace_diff, on
captures made here (a planted change: three more matmuls a step)."""

import json
import subprocess
import sys

import pytest

from tests.harness.cli.test_cli_plan import REPO
from tests.harness.measure.test_trace_diff import capture_matmuls


def _explain(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "explain", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def logdirs(tmp_path_factory):
    a, b = tmp_path_factory.mktemp("a"), tmp_path_factory.mktemp("b")
    capture_matmuls(a, 0)
    capture_matmuls(b, 3, steps=5)
    return a, b


def test_two_captures_are_explained_by_device_category_and_op(logdirs):
    a, b = logdirs
    proc = _explain(a, b, "--json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert (found["a"]["steps"], found["b"]["steps"]) == (3, 5)
    assert found["categories"][0]["name"] == "fusion: ynn"
    assert len([op for _, op in found["only_b"] if op.startswith("ynn_fusion")]) == 3
    for side in ("a", "b"):
        (parts,) = found[side]["breakdown_ms"].values()
        assert sum(parts[k] for k in ("compute", "collectives", "copies", "idle")) == (
            pytest.approx(parts["span"], rel=1e-3))
    table = _explain(a, b, "--top", "2")
    assert table.returncode == 0, table.stderr
    assert "| /host:CPU | fusion: ynn |" in table.stdout
    assert "Ops only in B: ynn_fusion" in table.stdout
    op_rows = table.stdout.split("By op")[1]
    assert len([line for line in op_rows.splitlines() if line.startswith("| /host")]) == 2


def test_a_directory_with_neither_results_nor_a_capture_is_refused(logdirs, tmp_path):
    proc = _explain(logdirs[0], tmp_path)
    assert proc.returncode == 2
    assert "no results (*.jsonl) and no .xplane.pb below it" in proc.stderr
