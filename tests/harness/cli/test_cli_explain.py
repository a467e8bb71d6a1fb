"""`parity explain` of two plans of one cell: the planted change (every gradient replicated
before the optimizer, tests/harness/cell/planted.py) is named first, by the figures the
plans themselves record.

Slow, the whole module: its every test reads TPU plans (~15 s each on 2 cores); `make test`
keeps a TPU plan of its own (tests/harness/cli/test_cli_plan.py) and explanations of records
(tests/harness/jobs/test_explain.py)."""

import json
import subprocess
import sys

import pytest

from reports.record import read_dir
from tests.harness.cli.test_cli_plan import REPO, plan

pytestmark = pytest.mark.slow

PLANT = "PARITY_PLANT"
"""tests/harness/cell/planted.py's choice of plant. Not imported from it: importing the
plugin registers its `native` in this process, in place of the real arm."""

SHAPE = ["--arms", "native", "--preset", "tiny-untied", "--seq", "16", "--batch", "16",
         "--ga", "2", "--mesh", "fsdp=8", "--scan-layers", "--remat", "full", "--save-hlo"]


def _explain(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness.cli", "explain", *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


def _planned(out, plant: str | None = None):
    extra = ("--plugin", "tests.harness.cell.planted") if plant else ()
    env = {PLANT: plant} if plant else {}
    proc = plan(*extra, *SHAPE, "--out", str(out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """`native` planned as it is, and with its gradients replicated (both with --save-hlo)."""
    return [_planned(tmp_path_factory.mktemp("real")),
            _planned(tmp_path_factory.mktemp("planted"), "replicate-gradients")]


def _peak_rows_sum_to_the_planned_peaks(found: dict, a, b) -> dict:
    """The peak section of an explanation, its rows checked against the two plans."""
    held = found["peak"]
    assert held is not None, found["peak_unavailable"]
    assert (held["a_peak"], held["b_peak"]) == (a.plan.planned_peak_bytes,
                                                b.plan.planned_peak_bytes)
    assert sum(r["change"] for r in held["rows"]) == held["change"]  # to the byte
    assert sum(r["a_bytes"] for r in held["rows"]) == a.plan.planned_peak_bytes
    assert sum(r["b_bytes"] for r in held["rows"]) == b.plan.planned_peak_bytes
    return held


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
    _peak_rows_sum_to_the_planned_peaks(found, a, b)
    table = _explain(real, planted, "--top", "3")
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.split("What holds")[0].splitlines()
             if line.startswith("| ")][1:]
    assert len(lines) == 3 and lines[0].startswith("| collective: all-reduce |")
    assert "Only in A: collective: reduce-scatter." in table.stdout
    # the movers are said to be what differs; plans carry no time, so no cause is claimed
    assert table.stdout.startswith("Movers are what differs between the two sides' programs")
    assert table.stdout.rstrip().endswith("Cause: none claimed: the sides carry no timing to "
                                          "compare (plans or captures); an A/B of the change "
                                          "(`parity ab`) can name one.")
    assert found["cause"].startswith("Cause: none claimed: the sides carry no timing")


def test_a_plan_against_itself_changes_nothing(planned):
    real, _ = planned
    found = json.loads(_explain(real, real, "--json").stdout)
    assert found["only_a"] == found["only_b"] == []
    assert all(r["a"] == r["b"] for r in found["rows"])
    assert found["peak"]["change"] == 0 and found["peak"]["rows"]
    assert all(r["change"] == 0 for r in found["peak"]["rows"])


# another TPU plan with donation off (~15 s)
def test_params_not_donated_are_new_outputs_of_exactly_the_params_bytes(planned, tmp_path):
    """PeftTrainer's way (the step's new params in buffers of their own): the outputs
    beyond the donated ones grow by exactly the bytes no longer aliased to an argument (the
    params as one device holds them, tile padding included), each a param's shape."""
    real, _ = planned
    kept = _planned(tmp_path, "no-donate")
    found = json.loads(_explain(real, kept, "--json").stdout)
    (a,), (b,) = read_dir(real), read_dir(kept)
    held = _peak_rows_sum_to_the_planned_peaks(found, a, b)
    outputs = [r for r in held["rows"] if r["section"] == "output" and r["change"]]
    unaliased = a.plan.executables["step"].alias - b.plan.executables["step"].alias
    assert sum(r["change"] for r in outputs) == unaliased > 0
    arguments = {r["shape"] for r in held["rows"] if r["section"] == "argument"}
    assert outputs and {r["shape"] for r in outputs} <= arguments
    assert held["rows"][0]["section"] == "output" and held["rows"][0]["change"] > 0


def _largest_param_bytes() -> int:
    import math

    import jax
    from flax import nnx

    from engine.model.config import get_preset
    from engine.model.decoder import Decoder

    config = get_preset("tiny-untied", scan_layers=True, remat="full")
    params = nnx.state(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))), nnx.Param)
    return max(math.prod(p.shape) * p.dtype.itemsize for p in jax.tree.leaves(params))


# another TPU plan with a planted all-gather (~15 s)
def test_an_extra_all_gather_of_a_param_is_the_first_mover(planned, tmp_path):
    real, _ = planned
    gathered = _planned(tmp_path, "gather")
    found = json.loads(_explain(real, gathered, "--json").stdout)
    (a,), (b,) = read_dir(real), read_dir(gathered)
    first = found["rows"][0]
    assert first["category"] == "collective: all-gather"
    assert first["b"]["count"] - first["a"]["count"] == 1
    # the largest param gathered whole: each of the 8 devices receives the 7 shards it lacks
    moved = first["b"]["collective_bytes"] - first["a"]["collective_bytes"]
    assert moved == _largest_param_bytes() * 7 / 8
    _peak_rows_sum_to_the_planned_peaks(found, a, b)


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


# another TPU plan of the engine (~20 s)
def test_a_split_step_peak_counts_the_state_it_holds_outside(planned, tmp_path):
    """`engine` against `native` at one shape: the engine's peak executable (fwd_bwd) runs
    while the optimizer moments stay in HBM outside it; that held state is a row of its
    own, so the rows still sum to each side's planned peak."""
    real, _ = planned
    proc = plan(*SHAPE, "--arms", "engine", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(_explain(real, tmp_path, "--json").stdout)
    (a,), (b,) = read_dir(real), read_dir(tmp_path)
    held = _peak_rows_sum_to_the_planned_peaks(found, a, b)
    (state,) = [r for r in held["rows"] if r["section"] == "held"]
    engine = b.plan.executables[b.plan.peak_executable]
    assert state["a_bytes"] == 0 and state["b_bytes"] == engine.held_bytes > 0
