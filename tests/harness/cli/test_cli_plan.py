"""`parity plan` from the outside: bad input refused before anything compiles, and a plan's
resident state checked against arithmetic."""

import fcntl
import json
import math
import os
import pathlib
import subprocess
import sys
import time

import jax
import optax
import pytest
from flax import nnx

from engine.model import LOGICAL_AXIS_RULES, Decoder, get_preset
from harness.xla import target
from reports.record import read_dir
from tests.harness.cli_helpers import parity_main

REPO = pathlib.Path(__file__).parents[3]
CELL = ["--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "8"]


def plan(*args, env=None, timeout=600) -> subprocess.CompletedProcess:
    """`parity plan ARGS` in a process of its own, with XLA's default flags (the tests'
    own XLA_FLAGS would change what libtpu compiles)."""
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu", **(env or {}))
    return subprocess.run([sys.executable, "-m", "harness.cli", "plan", *args], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=timeout)


def _refused(proc, tmp_path, message):
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("parity: error: "), proc.stderr
    assert message in lines[0]
    assert "start" not in proc.stdout  # no cell process started
    assert not list(tmp_path.rglob("*.jsonl"))  # nothing written


def _refused_here(capsys, tmp_path, message, *args):
    """`parity plan ARGS` refused in this process as `_refused` asks, and before libtpu was
    asked for a topology (its one way in, `target.topology_devices`)."""
    loaded = target.topology_devices.cache_info().currsize
    _refused(parity_main(capsys, "plan", *args), tmp_path, message)
    assert target.topology_devices.cache_info().currsize == loaded


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "tpu9:2x2"], "--target 'tpu9:2x2': give a TPU topology GENERATION:AxB[xC]"),
    (["--target", "v5e"], "give a TPU topology GENERATION:AxB[xC] with GENERATION one of"),
    (["--target-slices", "0"], "--target-slices 0: give at least 1 slice"),
    (["--rounds", "2"], "--rounds 2: a plan is deterministic"),
    (["--jobs", "0"], "--jobs 0: give at least 1 cell at a time"),
])
def test_bad_plan_options_exit_2_before_libtpu_is_loaded(tmp_path, capsys, args, message):
    """In this process, through the command line's entry point (harness.cli.main): refused
    before libtpu is loaded or anything is compiled, and before any cell started."""
    start = time.monotonic()
    _refused_here(capsys, tmp_path, message, *CELL, *args, "--out", str(tmp_path / "out"))
    assert time.monotonic() - start < 60  # refused up front: nothing compiled


def test_a_suites_timing_rounds_do_not_stop_its_plan(tmp_path, capsys):
    """tpu7x-nightly runs 4 rounds of each cell; its plan is made once, so only an explicit
    --rounds N > 1 is refused (here the plan gets as far as the target's name)."""
    _refused_here(capsys, tmp_path, "--target 'tpu9:2x2': give a TPU topology",
                  "--suite", "tpu7x-nightly", "--target", "tpu9:2x2", "--out",
                  str(tmp_path / "out"))


@pytest.mark.parametrize(("args", "message"), [
    (["--target", "v5e:3x3"], "--target v5e:3x3: libtpu cannot describe it"),
    (["--mesh", "fsdp=16", "--batch", "16"],
     "mesh 'fsdp=16' needs 16 devices but the target tpu7x:2x2x1 has 8"),
])
def test_what_only_libtpu_can_check_exits_2_before_any_cell(tmp_path, args, message):
    _refused(plan(*CELL, *args, "--out", str(tmp_path / "out"), timeout=300), tmp_path,
             message)


def test_libtpu_missing_exits_2_naming_the_fix(tmp_path):
    proc = plan(*CELL, "--out", str(tmp_path / "out"),
                env={target.LIBTPU_ENV: str(tmp_path / "no" / "libtpu.so")}, timeout=120)
    _refused(proc, tmp_path, "libtpu not found at")
    assert "run `make test`" in proc.stderr


def test_libtpu_held_by_another_process_exits_2_naming_it(tmp_path):
    """libtpu's lock is a POSIX lock on its lock file; a process that holds it (here one
    that takes it as libtpu does) is named, and nothing is loaded or compiled."""
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(target.LOCKFILE)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(120)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = plan(*CELL, "--out", str(tmp_path / "out"), timeout=120,
                    env={target.MULTIPLE_LOAD_ENV: ""})  # the lock as users have it
        _refused(proc, tmp_path, f"libtpu is loaded by another process (pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    fd = os.open(target.LOCKFILE, os.O_RDWR)
    try:  # released with its holder: the next plan may load libtpu
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _shard_bytes(state, sizes: dict[str, int]) -> int:
    """Bytes one device holds of `state` (abstract Params with logical axis names), from
    the shapes and the rules by hand: each dimension split over the mesh axis its logical
    name maps to (the first rule that names it), a replicated one held whole."""
    rules = dict(reversed(LOGICAL_AXIS_RULES))  # the first rule of a name wins
    total = 0
    for variable in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable)):
        names = variable.get_metadata()["out_sharding"]
        shape = variable.get_value().shape
        split = [sizes.get(rules.get(name) or "", 1) if name else 1 for name in names]
        total += 4 * math.prod(-(-d // s) for d, s in zip(shape, split, strict=True))
    return total


TINY = ["--preset", "tiny-untied", "--seq", "16", "--batch", "8", "--mesh", "fsdp=4,tensor=2"]


def plan_arms(out: pathlib.Path, arms: list[str], *args: str) -> dict:
    """`parity plan --arms ARMS ARGS --out OUT`, which must plan every cell: arm -> record."""
    proc = plan("--arms", ",".join(arms), *args, "--out", str(out), timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {r.arm: r for r in read_dir(out)}


def _planned(arm: str, out: pathlib.Path, run_id: str, *extra: str, env=None):
    proc = plan("--arms", arm, *TINY, *extra, "--out", str(out), "--run-id", run_id, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (record,) = read_dir(out / f"{run_id}.jsonl")
    return record


@pytest.fixture(scope="module")
def native_plans(tmp_path_factory):
    """`native` planned into an --out of its own, compiled (its HLO saved)."""
    out = tmp_path_factory.mktemp("native")
    return out, _planned("native", out, "cold", "--save-hlo")


@pytest.mark.slow  # a TPU compile of each arm's step (~30 s each on 2 cores)
@pytest.mark.parametrize("arm", ["engine", "native"])
def test_resident_state_is_three_shards_of_every_parameter_to_the_byte(tmp_path, arm,
                                                                       request):
    """AdamW in float32, the trainer's own program: params, then two moments
    sharded like them (plus AdamW's int32 step count), and the split engine's float32
    accumulator sharded like them too (plus its two scalar sums)."""
    record = (request.getfixturevalue("native_plans")[1] if arm == "native"
              else _planned(arm, tmp_path, "engine"))
    resident = record.plan.resident_bytes
    config = get_preset("tiny-untied")
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    params = nnx.state(abstract, nnx.Param)
    expected = _shard_bytes(params, {"fsdp": 4, "tensor": 2})
    counts = [x for x in jax.tree.leaves(jax.eval_shape(optax.adamw(1e-3).init, params))
              if x.shape == ()]
    assert resident["params"] == expected
    assert resident["opt_state"] == 2 * expected + 4 * len(counts)
    if arm == "engine":
        assert resident["accumulator"] == expected + 2 * 4
        # the optimizer state waits in memory through each fwd/bwd, outside its arguments
        assert record.plan.executables["fwd_bwd"].held_bytes == resident["opt_state"]
    else:
        assert "accumulator" not in resident
        assert record.plan.executables["step"].held_bytes == 0
    assert record.plan.planned_peak_bytes >= sum(resident.values()) - resident.get(
        "accumulator", 0)
    assert record.run.plan_target == target.TPU7X and record.timing is None
    assert json.loads(json.dumps(record.to_json()))["plan"]["mesh"] == {
        "data": 1, "fsdp": 4, "tensor": 2}


def test_a_plans_matmul_flops_are_the_same_programs_on_the_cpu(native_plans):
    """The plan's FLOPs per device are the matmuls of the program it planned: the same cell
    compiled for 8 CPU devices (this process's, tests/conftest.py) holds the same matmul
    FLOPs per device, counted from its HLO by the same reader, exactly (XLA:TPU writes some
    of them as padded convolutions: harness.xla.counts.convolution_flops), and XLA:CPU's
    own cost model of that program counts them too, with the elementwise work the plan
    leaves out (7% more at this seq-16 shape). Counting a padded convolution's every tap
    planned 1.5x to 5x the program's FLOPs."""
    from arms.registry import make_arm
    from arms.spec import CellSpec
    from harness.xla import counts
    from harness.xla.compiled import compiled_cost

    _, cold = native_plans
    arm = make_arm("native", CellSpec.from_dict(cold.spec.__dict__))
    arm.build()
    (compiled,) = arm.executables().values()
    cpu_matmul = counts.costs(compiled.as_text()).flops
    cpu_xla = compiled_cost(compiled).flops
    arm.close()
    assert cold.plan.flops_per_step == cpu_matmul
    assert cpu_matmul < cpu_xla


def test_a_plan_names_its_compiler_and_bounds_its_step_on_the_datasheet(native_plans):
    """The record names the libtpu build that compiled it, and carries the step's roofline:
    the plan's own FLOPs, HBM bytes and collective bytes per step over TPU7x's datasheet
    figures per device (harness.measure.devices), the largest of the three for its one
    executable."""
    from harness.measure.devices import DEVICES

    _, cold = native_plans
    plan = cold.plan
    assert plan.libtpu_build.startswith("TFRT TPU7x, Built on ")
    spec = DEVICES["TPU7x"]
    step = plan.roofline.step
    assert step.compute_s == pytest.approx(plan.flops_per_step / spec.bf16_flops, rel=1e-12)
    assert step.memory_s == pytest.approx(plan.hbm_bytes_per_step / spec.hbm_bytes_per_s,
                                          rel=1e-12)
    sent = sum(plan.collective_bytes_per_step.values())
    assert sum(step.collective_s.values()) == pytest.approx(
        sent / spec.interconnect_bytes_per_s, rel=1e-12)
    assert step.lower_bound_s == max(step.compute_s, step.memory_s,
                                     sum(step.collective_s.values()))
    assert 0 < plan.roofline.mfu_ceiling < 1


@pytest.mark.slow  # a third TPU compile of the step
def test_a_plan_read_from_the_plan_cache_is_the_compiled_one(native_plans):
    """The second plan of the same program, target and versions reads the first's back:
    every figure equal, nothing compiled; --no-plan-cache compiles it again."""
    out, cold = native_plans
    warm = _planned("native", out, "warm")
    forced = _planned("native", out, "forced", "--no-plan-cache")
    cold, warm, forced = cold.plan, warm.plan, forced.plan
    assert not cold.executables["step"].cached and cold.compile_s > 0
    assert warm.executables["step"].cached and warm.compile_s == 0
    assert not forced.executables["step"].cached and forced.compile_s > 0
    # A compile's HLO stage (until its buffer assignment is written) is part of it; a plan
    # read back compiled nothing, so it has none.
    for compiled in (cold, forced):
        assert 0 < compiled.executables["step"].hlo_stage_s < compiled.compile_s
    assert warm.executables["step"].hlo_stage_s is None
    for plan_ in (warm, forced):
        for field in ("planned_peak_bytes", "xla_peak_bytes", "resident_bytes",
                      "hbm_bytes_per_step", "flops_per_step", "collective_bytes_per_step",
                      "roofline", "libtpu_build"):
            assert getattr(plan_, field) == getattr(cold, field), field


@pytest.mark.slow  # a third TPU compile of the step
def test_a_plan_compiled_on_mimalloc_is_glibcs_to_the_byte(native_plans, tmp_path):
    """Plan processes preload mimalloc (harness.system.allocator.compile_env); a user's own
    glibc setting keeps glibc's malloc. Each compiles the same plan: every memory figure and the
    optimized HLO text equal, and the two records are one cell to compare."""
    out, cold = native_plans
    glibc = _planned("native", tmp_path, "glibc", "--no-plan-cache", "--save-hlo",
                     env={"MALLOC_ARENA_MAX": "2"})
    assert cold.environment.host_malloc == (
        "LD_PRELOAD=libmimalloc.so.3 MIMALLOC_ARENA_EAGER_COMMIT=1 MIMALLOC_PURGE_DELAY=-1")
    assert glibc.environment.host_malloc == "MALLOC_ARENA_MAX=2"
    (mine,), (theirs,) = (list(d.rglob("step.hlo.txt")) for d in (out, tmp_path))
    assert mine.read_text() == theirs.read_text()
    a, b = cold.plan.executables["step"], glibc.plan.executables["step"]
    assert not a.cached and not b.cached
    for field in ("argument", "output", "alias", "temp", "peak_memory_in_bytes",
                  "host_temp", "hbm_bytes", "flops", "collective_bytes"):
        assert getattr(a, field) == getattr(b, field), field
    assert glibc.cell_key() == cold.cell_key()
