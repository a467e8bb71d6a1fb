"""`parity explain` of two plans of one cell: the planted change (every gradient replicated
before the optimizer, tests/harness/cell/planted.py) is named first, by the figures the
plans themselves record."""

import json
import subprocess
import sys

import pytest

from reports.record import read_dir
from tests.harness.cli.test_cli_plan import REPO, plan

SHAPE = ["--arms", "native", "--preset", "tiny-untied", "--seq", "16", "--batch", "16",
         "--ga", "2", "--mesh", "fsdp=8", "--scan-layers", "--remat", "full", "--save-hlo"]


def _explain(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "explain", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`native` planned as it is, and with its gradients replicated (both with --save-hlo)."""
    sides = []
    for name, extra in (("real", ()), ("planted", ("--plugin", "tests.harness.cell.planted"))):
        out = tmp_path_factory.mktemp(name)
        proc = plan(*extra, *SHAPE, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
        sides.append(out)
    return sides


def test_the_planted_change_is_the_first_mover_and_the_rows_sum_to_the_plans(planned):
    real, planted = planned
    proc = _explain(real, planted, "--json")
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    rows = {r["category"]: r for r in found["rows"]}
    (a,), (b,) = read_dir(real), read_dir(planted)
    # every category of a side adds up to the plan's own per-step figures (loops counted)
    for side, record in (("a", a), ("b", b)):
        assert sum(r[side]["hbm_bytes"] for r in found["rows"]) == pytest.approx(
            record.plan.hbm_bytes_per_step, rel=1e-12)
        assert sum(r[side]["flops"] for r in found["rows"]) == record.plan.flops_per_step
    # the gradients are all-reduced where they were reduce-scattered: the first mover, the
    # reduce-scatters gone (on side A only), the replicated gradients' relayouts up
    movers = [r["category"] for r in found["rows"][:3]]
    assert movers[0] == "collective: all-reduce" and "collective: reduce-scatter" in movers
    assert found["only_a"] == ["collective: reduce-scatter"] and found["only_b"] == []
    copies = rows["copy/relayout"]
    assert copies["b"]["hbm_bytes"] > copies["a"]["hbm_bytes"]
    reduced = rows["collective: all-reduce"]
    assert reduced["b"]["collective_bytes"] - reduced["a"]["collective_bytes"] == (
        b.plan.collective_bytes_per_step["all-reduce"]
        - a.plan.collective_bytes_per_step["all-reduce"]) > 0
    table = _explain(real, planted, "--top", "3")
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(lines) == 3 and lines[0].startswith("| collective: all-reduce |")
    assert "Only in A: collective: reduce-scatter." in table.stdout


def test_a_plan_against_itself_changes_nothing(planned):
    real, _ = planned
    found = json.loads(_explain(real, real, "--json").stdout)
    assert found["only_a"] == found["only_b"] == []
    assert all(r["a"] == r["b"] for r in found["rows"])


def test_the_step_by_category_a_plan_carries_is_the_one_its_kept_hlo_gives(planned):
    """Two counts of one thing: the record's categories_per_step (made in the plan
    process) and the same split made here from the HLO files --save-hlo kept."""
    from harness.jobs import explain

    for side in planned:
        (record,) = read_dir(side)
        carried = explain.per_step(record)
        assert carried and sum(t.count for t in carried.values()) > 0
        record.plan.categories_per_step = {}
        assert explain.per_step(record) == carried


def test_a_record_without_its_step_by_category_is_refused_naming_the_fix(planned, tmp_path):
    real, _ = planned
    (record,) = read_dir(real)
    record.plan.hlo_dir = None
    record.plan.categories_per_step = {}
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps(record.to_json()) + "\n")
    proc = _explain(real, bare)
    assert proc.returncode == 2
    assert "carries no step by category" in proc.stderr
