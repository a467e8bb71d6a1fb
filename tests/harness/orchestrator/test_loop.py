"""The run loop end to end (harness.orchestrator.loop, through harness.jobs.run.run_grid):
real subprocesses, real arms, injected faults."""

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.grid.expand import expand
from harness.jobs.run import run_grid
from harness.measure.memory import RESERVE_PER_EXECUTION
from harness.store import results
from harness.system.allocator import HOST_MALLOC, describe
from reports.record import Failure, Record, ResultsError, read, read_dir
from tests.harness.cli_helpers import cli_env, parity_cli, parity_main

PLUGIN = "tests.harness.fault_arms"
TINY = {"preset": "tiny", "seq": 16, "batch": 4, "steps": 2, "warmup": 1}


@pytest.mark.slow  # a grid of fault arms in cell processes (~30 s)
def test_failing_cells_are_recorded_and_the_grid_completes(tmp_path):
    import tests.harness.fault_arms  # noqa: F401 - registers the test arms for expand()

    cells = expand({**TINY, "arms": ["native", "test-raise", "test-exit", "engine"],
                    "trace": True, "trace_steps": 2})
    cells = [dataclasses.replace(c, plugins=(PLUGIN,), trace_dir=str(tmp_path)) for c in cells]
    path, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    (hang,) = expand({**TINY, "arms": ["test-hang"]})
    _, hung = run_grid([dataclasses.replace(hang, plugins=(PLUGIN,))], tmp_path, env=cli_env(),
                       timeout_s=5, run_id="hang")
    by_arm = {r.arm: r for r in records + hung}
    assert by_arm["native"].ok and by_arm["engine"].ok
    assert by_arm["test-raise"].error.reason == "exception"
    assert "injected failure in step" in by_arm["test-raise"].error.message
    assert by_arm["test-exit"].error.reason == "crash"
    assert "exited with code 1" in by_arm["test-exit"].error.message
    assert by_arm["test-hang"].error.reason == "timeout"
    assert by_arm["test-hang"].error.message.startswith("cell exceeded its 5 s timeout; ")
    # The trace parse on CPU: native is one execution per step, split engine GA=1 two.
    assert by_arm["native"].trace.executions_per_step == [1, 1]
    assert by_arm["engine"].trace.executions_per_step == [2, 2]
    assert Path(by_arm["engine"].trace.xplane).exists()
    # Each traced cell's capture is named after its run and cell, below the trace root.
    for arm in ("native", "engine"):
        cell_dir = tmp_path / path.stem / f"{arm}-tiny-s16-b4-ga1"
        assert by_arm[arm].trace.logdir == str(cell_dir)
        assert Path(by_arm[arm].trace.xplane).is_relative_to(cell_dir)
    # Every record is on disk, in order, as valid JSONL, and reads back as it was written.
    assert read(path) == records
    ok = by_arm["native"]
    assert len(ok.timing.step_ms) == 2
    assert ok.parity.rel_l2 <= 1e-5
    assert ok.environment.backend == "cpu"
    assert ok.memory.executables["step"].total > 0
    assert ok.memory.heap_reserved_bytes == 0  # glibc's defaults: no heap kept to reserve


def test_only_plans_run_side_by_side(tmp_path):
    cells = expand({**TINY, "arms": ["native", "engine"]})
    with pytest.raises(ValueError, match="only plans run side by side; a timed cell runs alone"):
        run_grid(cells, tmp_path, env=cli_env(), timeout_s=60, jobs=2)
    assert not list(tmp_path.glob("*.jsonl"))


@pytest.mark.slow  # rounds of checked cell processes (~20 s)
def test_rounds_load_their_programs_and_shapes_share_one_reference(tmp_path):
    """Round 1 of a cell loads every program round 0 compiled (the persistent cache the
    run's cells share) and gets the same executables: equal compiled cost and planned
    memory. The second arm of a shape loads what the first compiled of their common code
    (our decoder's initializer) and reads the exact reference the first computed. Each
    record says which."""
    cells = expand({**TINY, "arms": ["native", "engine-fused"]})
    _, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300, rounds=2)
    by = {(r.arm, r.round): r for r in records}
    assert [(r.arm, r.round) for r in records] == [
        ("native", 0), ("engine-fused", 0), ("engine-fused", 1), ("native", 1)]
    for arm in ("native", "engine-fused"):
        cold, warm = by[arm, 0], by[arm, 1]
        assert warm.timing.compile_cache_hits == warm.timing.compiles == cold.timing.compiles
        untimed = {"model_flops_per_s": None, "mfu_vs_bf16_peak": None}  # from the median
        assert dataclasses.replace(warm.cost, **untimed) == dataclasses.replace(cold.cost,
                                                                                **untimed)
        assert warm.memory.executables == cold.memory.executables
        assert warm.timing.recompiles_after_warmup == 0
        # Where the cell's time went, phase by phase, within its process's wall time.
        assert {"start", "imports", "build", "compile", "warmup", "timed"} <= set(cold.phases)
        # Each arm's zygote imported once, before its first cell (not in that cell's wall).
        assert "preload" in cold.phases and "preload" not in warm.phases
        assert sum(v for k, v in cold.phases.items() if k != "preload") <= cold.wall_s
        assert "reference" in cold.phases and warm.parity is None
    first, second = by["native", 0].timing, by["engine-fused", 0].timing
    assert first.compile_cache_hits == 0 < first.compiles
    assert 0 < second.compile_cache_hits < second.compiles  # the initializer, not its step
    native, fused = by["native", 0].parity, by["engine-fused", 0].parity
    assert not native.reference_shared and fused.reference_shared
    assert native.reference_computed_s == fused.reference_computed_s > 0
    assert fused.reference_s < native.reference_s  # read back, not computed
    assert (fused.exact_loss, fused.exact_grad_l2) == (native.exact_loss, native.exact_grad_l2)
    assert fused.rel_l2 <= 1e-5 and native.rel_l2 <= 1e-5


@pytest.mark.slow  # two shapes of cell processes (~20 s)
def test_an_arms_second_shape_loads_only_what_does_not_depend_on_the_shape(tmp_path):
    """The cells of a run share one cache: at GA 2 the engine loads the model's initializer
    and its update (neither depends on GA) and compiles its fwd/bwd cold. What it loaded is
    the executable it would have compiled: the same update cost as the GA 1 cell's."""
    cells = expand({**TINY, "arms": ["engine"], "ga": [1, 2]})
    _, (ga1, ga2) = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    assert ga1.timing.compile_cache_hits == 0 < ga1.timing.compiles
    assert 0 < ga2.timing.compile_cache_hits < ga2.timing.compiles
    update = ga1.cost.bytes_accessed_per_executable["update"]
    assert ga2.cost.bytes_accessed_per_executable["update"] == update
    assert ga2.memory.executables["update"] == ga1.memory.executables["update"]
    # Its planned peak counts the optimizer state held beside its fwd/bwd kernels.
    for record in (ga1, ga2):
        memory = record.memory
        assert memory.executables["fwd_bwd"].held > 0 == memory.executables["update"].held
        assert memory.planned_bytes == max(m.total + m.held
                                           for m in memory.executables.values())


def _zygotes_of_this_process() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            command = (entry / "cmdline").read_bytes()
        except (OSError, ValueError, IndexError):  # not a pid, or it exited meanwhile
            continue
        if parent == os.getpid() and b"harness.cell.zygote" in command:
            found.append(int(entry.name))
    return found


def test_work_alongside_runs_while_the_zygotes_import_and_its_failure_ends_the_run(tmp_path):
    """`alongside` (the selftest of `parity run --selftest`) runs once every arm's zygote has
    started, before any cell; what it raises ends the run: no record, no zygote left."""
    cells = expand({**TINY, "arms": ["native", "engine"]})
    seen = []

    def alongside():
        seen.append(len(_zygotes_of_this_process()))
        raise RuntimeError("the selftest failed")

    with pytest.raises(RuntimeError, match="the selftest failed"):
        run_grid(cells, tmp_path, env=cli_env(), timeout_s=300, alongside=alongside)
    assert seen == [2]
    assert list(tmp_path.glob("*.jsonl")) == []
    assert _zygotes_of_this_process() == []


@pytest.mark.slow  # forked and fresh cell processes (~20 s)
def test_a_forked_worker_measures_what_a_fresh_interpreter_does(tmp_path):
    """The zygote only saves the imports: a cell forked from it compiles the same programs,
    plans the same memory and computes the same gradient as one in a fresh interpreter."""
    (cell,) = expand({**TINY, "arms": ["engine"]})
    (forked,), (fresh,) = (run_grid([cell], tmp_path, env=cli_env(), timeout_s=300,
                                    prefork=prefork)[1] for prefork in (True, False))
    assert "preload" in forked.phases and "preload" not in fresh.phases
    untimed = {"model_flops_per_s": None, "mfu_vs_bf16_peak": None}
    assert dataclasses.replace(forked.cost, **untimed) == dataclasses.replace(fresh.cost,
                                                                              **untimed)
    assert forked.memory.executables == fresh.memory.executables
    # the second reads back the reference the first computed: the same numbers
    assert dataclasses.replace(forked.parity, reference_shared=True, reference_s=0) == (
        dataclasses.replace(fresh.parity, reference_s=0))
    assert (forked.timing.compiles, forked.timing.executions_per_step) == (
        fresh.timing.compiles, fresh.timing.executions_per_step)
    assert forked.environment == fresh.environment


@pytest.mark.slow  # two rounds of forked cell processes (~13 s)
def test_a_zygote_that_dies_fails_its_cell_and_the_next_cell_gets_a_new_one(tmp_path):
    import tests.harness.fault_arms  # noqa: F401 - registers the test arms for expand()

    cells = expand({**TINY, "arms": ["test-kill-zygote", "native"], "parity": False})
    cells = [dataclasses.replace(c, plugins=(PLUGIN,)) for c in cells]
    _, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=120, rounds=2)
    killed = [r for r in records if r.arm == "test-kill-zygote"]
    # Both rounds were forked (the arm refuses to run otherwise): the second by a new zygote.
    assert [r.error.reason for r in killed] == ["crash", "crash"]
    for record in killed:
        assert "the zygote forking test-kill-zygote's workers exited" in record.error.message
    assert [r.ok for r in records if r.arm == "native"] == [True, True]


@pytest.mark.slow  # three cell processes; the reason alone: tests/arms/models/test_maxtext_qwen3
def test_without_maxtext_only_the_maxtext_arms_fail_and_say_why(tmp_path):
    cells = expand({**TINY, "arms": ["native", "peft-maxtext", "maxtext-engine"],
                    "parity": False, "remat": "full"})
    cells = [dataclasses.replace(c, plugins=("tests.harness.no_maxtext",)) for c in cells]
    _, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    by_arm = {r.arm: r for r in records}
    assert by_arm["native"].ok
    for arm in ("peft-maxtext", "maxtext-engine"):
        assert by_arm[arm].status == "failed"
        assert "the maxtext arms need the `maxtext` package" in by_arm[arm].error.message


@pytest.mark.slow  # a run of cell processes stopped by SIGINT (~11 s)
def test_sigint_keeps_finished_cells_and_valid_jsonl(tmp_path):
    command = [sys.executable, "-m", "harness.cli", "run", "--arms", "native",
               "--preset", "tiny", "--seq", "16,32,64", "--rounds", "3", "--batch", "4",
               "--ga", "1",
               "--steps", "2", "--warmup", "1", "--no-parity", "--out", str(tmp_path)]
    proc = subprocess.Popen(command, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while time.time() < deadline:
        files = list(tmp_path.glob("*.jsonl"))
        if files and files[0].read_text().count("\n") >= 1:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    records = read(files[0])  # raises on any torn line
    assert 1 <= len(records) < 9
    assert all(r.ok for r in records)
    # Cells ran under, and record, the CPU allocator settings, and faulted in the heap their
    # executions reuse before timing.
    assert {r.environment.host_malloc for r in records} == {describe(HOST_MALLOC)}
    for r in records:
        fresh = max(m.temp + m.output - m.alias for m in r.memory.executables.values())
        assert r.memory.heap_reserved_bytes == RESERVE_PER_EXECUTION * fresh > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--arms", "engine,warp"], "unknown arm 'warp'; valid arms"),
    (["--preset", "giant"], "unknown model preset 'giant'"),
    (["--suite", "nope"], "unknown suite 'nope'; valid suites: cpu-default"),
    (["--batch", "8", "--ga", "3"], "--ga 3 does not divide --batch 8"),
    (["--mesh", "tensor=4", "--cpu-devices", "4"], "more tensor shards than kv heads"),
    pytest.param(["--arms", "native,peft-maxtext", "--scan-layers"],
                 "remat=none cannot be expressed", marks=pytest.mark.maxtext),
    pytest.param(["--arms", "native,maxtext-engine"],
                 "remat=none cannot be expressed; use --remat full", marks=pytest.mark.maxtext),
    (["--arms", "peft-tunix", "--remat", "minimal"], "has no equivalent in Tunix's Qwen3"),
    (["--arms", "native,native"], "--arms names native twice (native,native); give each value "
                                  "once, and --rounds N"),
    (["--seq", "16,32,16"], "--seq names 16 twice"),
    (["--run-id", "../escaped"], "--run-id '../escaped': give a plain name (no '/', not '..')"),
    (["--run-id", "/abs/path/here"], "--run-id '/abs/path/here': give a plain name"),
    (["--run-id", "sub/dir/x"], "--run-id 'sub/dir/x': give a plain name"),
    (["--run-id", ".."], "--run-id '..': give a plain name"),
])
def test_bad_input_is_one_clear_error_before_any_cell(tmp_path, capsys, args, message):
    """`parity run`'s own entry point, in this process (the command line's exit code and
    standard error, without an interpreter's start-up a case)."""
    base = ["--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4"]
    proc = parity_main(capsys, "run", *base, *args, "--out", str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_a_mesh_larger_than_the_host_is_refused_naming_the_flag(tmp_path):
    """A process of its own: this one emulates 8 CPU devices, a user's shell has one."""
    proc = parity_cli("run", "--arms", "native", "--preset", "tiny", "--seq", "16", "--batch",
                      "4", "--mesh", "fsdp=4", "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert ("mesh 'fsdp=4' needs 4 devices but this cpu host has 1; on CPU pass "
            "--cpu-devices") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_results_reader_names_file_line_and_field(tmp_path):
    path = tmp_path / "r.jsonl"
    results.append(path, Record(status="failed", wall_s=float("nan"),
                                error=Failure(reason="crash", message="boom")))
    (back,) = read(path)
    assert back.wall_s is None and back.error == Failure(reason="crash", message="boom")
    with path.open("a") as f:
        f.write('{"schema": 2, "status": "ok", "wall_s": "slow"}\n')
    with pytest.raises(ResultsError, match=r"r.jsonl:2: field 'wall_s': expected float"):
        read(path)
    path.write_text('{"schema": 2, "timing": {"steps": 3}}\n')
    with pytest.raises(ResultsError, match=r"r.jsonl:1: missing field 'timing.warmup'"):
        read(path)
    path.write_text('{"schema": 1, "cut')
    with pytest.raises(ResultsError, match=r"r.jsonl:1: not valid JSON"):
        read(path)
    with pytest.raises(ResultsError, match="no such results directory"):
        read_dir(tmp_path / "missing")
