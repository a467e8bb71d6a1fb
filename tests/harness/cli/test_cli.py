import subprocess
import sys
import time

import pytest

from tests.harness.cli_helpers import parity_main


@pytest.mark.slow  # the whole selftest (three models, eight variants) and a cell in a subprocess
# (~50 s); make parity runs it too
@pytest.mark.maxtext
def test_selftest_prints_counts_loss_and_three_model_parity_before_the_first_cell(tmp_path):
    """`parity run --selftest` (what `make parity` runs): the selftest's lines, then the
    cells; it runs while the arms' packages import, and no cell starts before it passed."""
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--selftest", "--arms",
                           "native", "--preset", "tiny", "--seq", "16", "--batch", "4",
                           "--steps", "2", "--warmup", "1", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "preset tiny: 90,496 parameters" in out
    assert "preset qwen3-0.6b: 596,049,920 parameters" in out
    assert "ragged micro-batches [64, 16, 40, 8]" in out
    # 8 variants (tied/untied x scanned x packed): decoder vs Tunix in each; untied also
    # decoder vs MaxText and MaxText vs Tunix; tied the bf16-head proof of MaxText's gap.
    assert out.count(" ok\n") == 8 + 4 * 2 + 4
    assert out.count("MaxText vs decoder with bf16-rounded head") == 4
    assert out.count("casts the embedding to bfloat16") == 8
    assert "FAIL" not in out
    assert out.index("selftest passed in") < out.index("[1/1] start native tiny")
    assert len(list(tmp_path.glob("*.jsonl"))) == 1


def test_unknown_preset_is_one_clear_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "selftest", "--preset", "huge"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("parity: error: unknown model preset 'huge'; valid")
    assert "Traceback" not in proc.stderr


# ----------------------------------------------------------- bad values, refused up front
SPAWNS = ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.forkpty", "os.exec", "os.system")
_spawned: list[str] | None = None


def _audit(event, args):
    if _spawned is not None and event in SPAWNS:
        _spawned.append(f"{event} {args[:2]!r:.200}")


sys.addaudithook(_audit)  # permanent once added; it records only while a test arms it

CELL = ["--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4"]


def _bad_values(tmp_path):
    """(argv, expected message): one bad value each, from issue 15's items 3, 4, 7, 8, 10,
    11 (and the earlier basics)."""
    out = ["--out", str(tmp_path / "out")]
    corrupt = tmp_path / "history"
    return [
        (["run", *CELL, "--out", str(tmp_path / "afile")], "is a file; give a directory"),
        (["run", *CELL, "--out", "/proc/parity-out"], "cannot write in /proc"),
        (["nightly", *CELL, "--history", str(corrupt)], "history.jsonl:1: not valid JSON"),
        (["run", *CELL, "--batch", "0", *out], "--batch 0: give a batch of at least 1 row"),
        (["run", *CELL, "--batch", "8", "--ga", "4", "--ragged", "0,0,0,0", *out],
         "the step has no loss tokens"),
        (["run", *CELL, "--seq", "0", *out], "--seq 0: give a sequence length from 2"),
        (["run", *CELL, "--seq", "-5", *out], "--seq -5: give a sequence length from 2"),
        (["run", *CELL, "--seq", "100000000", *out], "to 40960 (Qwen3's context length)"),
        (["run", *CELL, "--batch", "-4", *out], "--batch -4: give a batch of at least 1"),
        (["run", *CELL, "--steps", "0", *out], "--steps 0: give at least 1"),
        (["run", *CELL, "--warmup", "0", *out], "a first step is never timed"),
        (["run", *CELL, "--timeout", "-5", *out], "--timeout -5.0: give the seconds"),
        (["run", *CELL, "--cpu-devices", "-3", *out], "--cpu-devices -3: give at least 1"),
        (["run", *CELL, "--cpu-devices", "0", *out], "--cpu-devices 0: give at least 1"),
        (["run", *CELL, "--plugin", "nosuch_module", *out],
         "--plugin nosuch_module: cannot import it (No module named 'nosuch_module')"),
        (["report", str(tmp_path / "results"), "-o", "/proc/parity/parity.md"],
         "-o /proc/parity: cannot write in /proc"),
        (["report", str(tmp_path / "missing"), "-o", str(tmp_path / "new" / "parity.md")],
         "missing: no such results directory"),  # and `new/` is not created
        (["run", *CELL, "--mesh", "fsdp=", *out],
         "mesh axis fsdp='' in 'fsdp=': a size is a positive integer, or -1"),
        (["run", *CELL, "--mesh", "fsdp=2,fsdp=4", *out], "'fsdp' is given twice"),
        (["run", *CELL, "--mesh", "fsdp=-1,tensor=-1", *out], "2 axes of size -1"),
        (["run", *CELL, "--batch", "8", "--ga", "4", "--ragged=-1,2,3,4", *out],
         "a count of -1 loss tokens; give counts >= 0"),
        (["run", *CELL, "--seq", "3.5", *out], "argument --seq: '3.5' is not a whole number"),
        (["run", *CELL, "--batch", "8", "--ga", "4", "--ragged", "1,2,3", *out],
         "--ragged gives 3 counts but no cell has ga=3 (ga: 4)"),
        (["run", *CELL, "--mesh", "fsdp=3,data=-1", *out],
         "mesh fsdp=3 cannot split embed_dim=64"),
        (["ab", "HEAD", "HEAD", "--allow-dirty", *CELL, "--rounds", "3", "--pairing",
          "processes", *out], "--rounds 3: A/B needs at least 6 rounds"),
        (["ab", "HEAD", "HEAD", "--allow-dirty", *CELL, "--rounds", "1", *out],
         "--rounds 1 with --slices 5: lockstep A/B needs at least 2 rounds and 6 slice pairs"),
        (["ab", "HEAD", "HEAD", "--allow-dirty", *CELL, "--rounds", "2", "--slices", "2", *out],
         "--rounds 2 with --slices 2: lockstep A/B needs at least 2 rounds and 6 slice pairs"),
        (["launch", "-n", "2", "--", *CELL, "--steps", "0", *out], "--steps 0: give at least"),
    ]


def test_every_bad_value_exits_2_at_once_with_one_line_no_process_and_nothing_written(
        tmp_path, capsys):
    global _spawned
    (tmp_path / "afile").write_text("")
    (tmp_path / "history").mkdir()
    (tmp_path / "history" / "history.jsonl").write_text('{"schema": 3, "cut')
    (tmp_path / "results").mkdir()
    good = tmp_path / "results" / "r.jsonl"
    from harness.store import results
    from reports.record import Failure, Record

    results.append(good, Record(status="failed", error=Failure(reason="crash", message="x")))
    before = sorted(p for p in tmp_path.rglob("*"))
    for argv, message in _bad_values(tmp_path):
        _spawned = []
        start = time.perf_counter()
        try:
            proc = parity_main(capsys, *argv)
        finally:
            spawned, _spawned = _spawned, None
        elapsed = time.perf_counter() - start
        code, err = proc.returncode, proc.stderr
        assert code == 2, (argv, err)
        assert message in err, (argv, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert spawned == [], (argv, spawned)
        assert elapsed < 5, (argv, elapsed)
        assert sorted(p for p in tmp_path.rglob("*")) == before, argv


def test_a_multi_process_run_without_a_mesh_spans_every_device(tmp_path):
    from harness.cli import build_parser
    from harness.cli.grid_args import request
    from harness.grid.options import MULTI_PROCESS_MESH
    from harness.jobs.grid import check

    args = build_parser().parse_args(["run", *CELL, "--out", str(tmp_path)])
    assert not check(request(args, tmp_path)).get("mesh")  # one process: one device
    assert check(request(args, tmp_path), processes=2)["mesh"] == MULTI_PROCESS_MESH
    given = build_parser().parse_args(["run", *CELL, "--mesh", "fsdp=2"])
    assert check(request(given, tmp_path), processes=2)["mesh"] == "fsdp=2"


def test_commands_that_read_results_never_import_jax():
    """`compare`, `report` and `--help` parse only their own arguments; the grid commands'
    choices come from modules that import JAX, which they have no use for."""
    probe = ("import sys\nfrom harness.cli import main\n"
             "for argv in (['compare', '--help'], ['report', '--help'], ['--help']):\n"
             "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
             "print('jax imported:', 'jax' in sys.modules)\n"
             "try:\n    main(['run', '--help'])\nexcept SystemExit:\n    pass\n"
             "print('jax imported:', 'jax' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported = [line for line in proc.stdout.splitlines() if line.startswith("jax imported")]
    assert imported == ["jax imported: False", "jax imported: True"]  # run needs JAX
    assert "--arms ARMS" in proc.stdout and "--fail-on-regression" in proc.stdout
