"""harness.jobs.ab: how A's and B's processes share the machine, by backend: side by side
in lockstep on the CPU; one after the other on an accelerator, whose chips one process at a
time holds."""

import subprocess
import sys
from pathlib import Path

import pytest

from harness.contract import LOCKSTEP, PROCESSES
from harness.jobs.ab import pairing_for, precheck


def test_the_default_pairing_is_lockstep_on_cpu_and_processes_on_an_accelerator():
    assert pairing_for({"backend": "cpu"}, None) == LOCKSTEP
    for accelerator in ("tpu", "gpu"):
        assert pairing_for({"backend": accelerator}, None) == PROCESSES
        assert pairing_for({"backend": accelerator}, PROCESSES) == PROCESSES
        with pytest.raises(ValueError, match=f"--pairing lockstep runs A's and B's processes "
                                             f"side by side, and on this {accelerator} host "
                                             "one process at a time holds the accelerator"):
            pairing_for({"backend": accelerator}, LOCKSTEP)
    assert pairing_for({"backend": "cpu"}, PROCESSES) == PROCESSES


def test_rounds_that_suit_no_pairing_are_refused_before_the_device_is_probed():
    """Left to the backend, values that suit neither pairing fail at once (as lockstep's,
    the CPU's default); values that suit one wait for the probe to say which."""
    with pytest.raises(ValueError, match="--rounds 1 with --slices 5: lockstep"):
        precheck({"rounds": 1, "steps": 10}, None, 5)
    precheck({"rounds": 8, "steps": 10}, None, 3)  # processes would take it: not refused yet
    with pytest.raises(ValueError, match="--slices 3 with --steps 10"):
        precheck({"rounds": 8, "steps": 10}, LOCKSTEP, 3)
    with pytest.raises(ValueError, match="--rounds 3: A/B needs at least 6 rounds"):
        precheck({"rounds": 3, "steps": 10}, PROCESSES, 5)


def test_every_side_times_the_trainer_s_own_program():
    """Every cell sends `capture` False (a worker of protocol 3 would build the gradient
    capture into its step where it is True, or missing); a ref whose worker always builds it
    (protocol < 3) is refused: the two sides would time different work."""
    import json
    from types import SimpleNamespace

    from harness.contract import cell_json
    from harness.grid.expand import expand
    from harness.jobs.ab import check_times_trainer, side_tasks
    from tests.harness.orchestrator.test_loop import TINY

    grid = SimpleNamespace(cells=expand({**TINY, "arms": ["native"]}), rounds=2)
    sinks = {side: SimpleNamespace(run_id=side) for side in "AB"}
    tasks = side_tasks(grid, sinks, lockstep=False)
    assert len(tasks) == 4
    assert {json.loads(cell_json(slot.cell))["capture"] for task in tasks for slot in task} == {
        False}

    def ref(version):
        return SimpleNamespace(sha="0123456789ab", protocol=SimpleNamespace(version=version))

    check_times_trainer({"A": ref(3), "B": ref(4)})
    with pytest.raises(ValueError, match=r"A \(0123456789\) times its steps with the gradient "
                                         r"capture chained in \(its worker speaks protocol 2\)"):
        check_times_trainer({"A": ref(2), "B": ref(4)})


def test_a_sides_site_directory_comes_after_its_worktree_and_before_the_rest(tmp_path):
    """A side's packages (its stack's site directory) are imported before the
    interpreter's own, and its commit's code before both."""
    import os

    from harness.orchestrator.refs import Protocol, Ref, Stack

    ref = Ref("B", "0" * 40, tmp_path / "tree", Protocol(3, "harness.cell"),
              Stack(site=str(tmp_path / "site")))
    assert ref.env({"PYTHONPATH": "/x", "K": "v"}) == {
        "K": "v", "PYTHONPATH": os.pathsep.join([str(tmp_path / "tree"),
                                                 str(tmp_path / "site"), "/x"])}
    plain = Ref("A", "0" * 40, tmp_path / "tree", Protocol(3, "harness.cell"))
    assert plain.env({})["PYTHONPATH"] == str(tmp_path / "tree")


def test_a_stack_that_cannot_run_is_refused_naming_its_option(tmp_path):
    from harness.orchestrator.refs import Stack, check_stack

    with pytest.raises(ValueError, match=f"--python-b {tmp_path}/none: cannot run it"):
        check_stack(Stack(python=str(tmp_path / "none")), "--python-b", "--site-b")
    with pytest.raises(ValueError, match="--python-a /bin/true: not a Python 3 interpreter"):
        check_stack(Stack(python="/bin/true"), "--python-a", "--site-a")
    with pytest.raises(ValueError, match=f"--site-b {tmp_path}/gone: no such directory"):
        check_stack(Stack(site=str(tmp_path / "gone")), "--python-b", "--site-b")
    check_stack(Stack(python=sys.executable, site=str(tmp_path)), "--python-a", "--site-a")


def test_the_records_of_two_stacks_are_compared_cell_by_cell_across_their_versions():
    """An A/B of two software stacks compares cells whose records differ in the package
    versions they carry (what the A/B is about); every other comparison keeps them apart."""
    import dataclasses

    from reports.compare import compare_sets
    from tests.reports.helpers import fixture_records

    old = [r for r in fixture_records(("native",)) if r.ok]
    new = [dataclasses.replace(r, environment=dataclasses.replace(
        r.environment, versions={**r.environment.versions, "flax": "0.13.0"})) for r in old]
    with pytest.raises(ValueError, match="no cell in common"):
        compare_sets(old, new)
    rows = compare_sets(old, new, across_stacks=True)
    assert len(rows) == len({r.cell_key() for r in old}) and all(row.timing for row in rows)


def test_the_ab_markdown_names_each_sides_stack_and_the_versions_it_recorded():
    import dataclasses

    from harness.jobs.ab import ABResult, stack_lines
    from harness.orchestrator.refs import Stack
    from tests.reports.helpers import fixture_records

    a = [r for r in fixture_records(("native",)) if r.ok][:1]
    b = [dataclasses.replace(r, environment=dataclasses.replace(
        r.environment, versions={**r.environment.versions, "flax": "0.13.0"})) for r in a]
    same = ABResult(records={"A": a, "B": a}, rows=[], shas={"A": "a", "B": "a"})
    assert stack_lines(same) == []  # one stack: nothing to say
    result = ABResult(records={"A": a, "B": b}, rows=[], shas={"A": "a", "B": "a"},
                      stacks={"B": Stack(site="/s")})
    lines = stack_lines(result)
    flax_a = a[0].environment.versions["flax"]
    assert lines[1].startswith(f"- A: this environment; recorded versions: flax {flax_a}, ")
    assert lines[2].startswith("- B: site /s; recorded versions: flax 0.13.0, ")


def _stack_ab(tmp_path, *stack):
    from tests.harness.cli_helpers import REPO, cli_env

    return subprocess.run(
        [sys.executable, "-m", "harness.cli", "ab", "HEAD", "HEAD", "--allow-dirty", *stack,
         "--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4", "--ga", "1",
         "--steps", "6", "--warmup", "1", "--rounds", "2", "--slices", "3", "--no-parity",
         "--out", str(tmp_path / "out")], cwd=REPO, env=cli_env(), capture_output=True,
        text=True, timeout=600)


def _venv(path: Path, *packages: str) -> Path:
    """A venv of this interpreter's base Python: bare, or with `packages` installed in its
    own site-packages (pip --target, no dependencies) and this environment's site-packages
    after them (a .pth), so it runs the project with those packages replaced."""
    import sysconfig

    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                    "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                          text=True, check=True).stdout.strip()
    if packages:
        (Path(site) / "parity-base.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        _pip(site, *packages)
    return python


def _pip(target, *packages: str) -> None:
    """pip install --no-deps --target `target` `packages`; the test is skipped where the
    package index cannot give them (no index reachable)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                           "--target", str(target), *packages], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"pip cannot install {' '.join(packages)} here: {proc.stderr[-300:]}")


OTHER_ORBAX = "0.12.4"
"""An orbax-checkpoint other than the lock's (0.12.8) that imports beside its jax: the
package a side's stack changes (nothing a native cell runs imports it; its version is
recorded all the same)."""


@pytest.mark.slow  # one A/B of 2 lockstep rounds, and a pip install
def test_each_side_of_an_ab_can_run_in_a_software_stack_of_its_own(tmp_path):
    """A: this interpreter with a site directory holding orbax-checkpoint 0.12.4; B: another
    interpreter (a venv) whose own site-packages hold it. Both sides' records say 0.12.4,
    which neither would without its stack (this environment has the lock's 0.12.8)."""
    import importlib.metadata
    import json

    assert importlib.metadata.version("orbax-checkpoint") != OTHER_ORBAX
    site = tmp_path / "site"
    _pip(site, f"orbax-checkpoint=={OTHER_ORBAX}")
    python = _venv(tmp_path / "venv", f"orbax-checkpoint=={OTHER_ORBAX}")
    proc = _stack_ab(tmp_path, "--site-a", str(site), "--python-b", str(python))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {path.stem[-1]: [json.loads(line) for line in path.read_text().splitlines()]
               for path in (tmp_path / "out").glob("ab-*.jsonl")}
    assert {side: {r["environment"]["versions"]["orbax-checkpoint"] for r in found}
            for side, found in records.items()} == {"A": {OTHER_ORBAX}, "B": {OTHER_ORBAX}}
    text = (tmp_path / "out" / "ab.md").read_text()
    assert f"- A: site {site}; recorded versions: " in text
    assert f"- B: python {python}; recorded versions: " in text
    assert "| native tiny seq=16 batch=4 ga=1 |" in text and "| 2 / 2 |" in text


@pytest.mark.slow  # one A/B of up to 2 lockstep rounds, B's cells failing at once
def test_a_stack_whose_cells_cannot_run_is_a_failed_row_and_exit_1(tmp_path):
    """B in an interpreter without jax: its workers die before recording anything; their
    failures stand in the cell's row (the side's commit, no versions), not as a cell of
    their own, the cell stops after its first round (B failed in every round it ran), and
    the A/B exits 1."""
    python = _venv(tmp_path / "bare")
    proc = _stack_ab(tmp_path, "--python-b", str(python))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = (tmp_path / "out" / "ab.md").read_text()
    assert "| native tiny seq=16 batch=4 ga=1 |" in text and "| 1 / 0 | - | failed |" in text
    crash = "new: crash: cell process exited with code 1 without a record"
    assert crash in text and f"{crash} (x" not in text  # once: no second round
    assert "failed: B's cell failed in every round, after 1 of 2 rounds" in text
    assert f"- B: python {python}; recorded versions: none (no cell recorded its own)" in text


def test_a_stack_that_cannot_run_is_refused_before_any_cell(tmp_path):
    from tests.harness.cli_helpers import parity_cli

    proc = parity_cli("ab", "HEAD", "HEAD", "--allow-dirty", "--python-b",
                      str(tmp_path / "none"), "--arms", "native", "--preset", "tiny",
                      "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"parity: error: --python-b {tmp_path}/none: cannot run it")
    assert not (tmp_path / "out").exists()


def test_records_that_differ_only_in_our_decoders_options_compare_only_across_options():
    """An A/B of a decoder option compares cells whose specs differ in that option alone;
    every other comparison keeps them apart, and across options other work still does."""
    import dataclasses

    from reports.compare import compare_sets
    from tests.reports.helpers import fixture_records

    old = [r for r in fixture_records(("native",)) if r.ok]

    def given(record, **options):
        return dataclasses.replace(record, spec=dataclasses.replace(record.spec, **options),
                                   config_hash=f"{record.config_hash}-{sorted(options)}")

    new = [given(r, attention="splash") for r in old]
    with pytest.raises(ValueError, match="no cell in common"):
        compare_sets(old, new)
    rows = compare_sets(old, new, across_options=True)
    assert len(rows) == len({r.cell_key() for r in old}) and all(row.timing for row in rows)
    other = [given(r, attention="splash", remat="full") for r in old]
    with pytest.raises(ValueError, match="no cell in common"):
        compare_sets(old, other, across_options=True)


def test_a_sides_decoder_options_apply_to_its_cells_only_and_bad_ones_are_refused():
    from harness.grid.expand import expand
    from harness.jobs.ab import side_cells

    cells = expand({"arms": ["engine", "native"], "preset": "tiny", "seq": 32, "batch": 4})
    found = side_cells(cells, {"A": {"logits_chunk": 8}})
    assert [c.spec.get("logits_chunk", 0) for c in found["A"]] == [8, 8]
    assert found["B"] == cells
    with pytest.raises(ValueError, match="--set-a remat: only our decoder's options"):
        side_cells(cells, {"A": {"remat": "full"}})
    with pytest.raises(ValueError, match="does not divide seq 32"):
        side_cells(cells, {"B": {"logits_chunk": 24}})
    tunix = expand({"arms": ["peft-tunix"], "preset": "tiny", "seq": 32, "batch": 4})
    with pytest.raises(ValueError, match="--set-b: peft-tunix compute their own attention"):
        side_cells(tunix, {"B": {"attention": "xla"}})


@pytest.mark.slow  # one A/B of 2 lockstep rounds
def test_an_ab_of_a_decoder_option_runs_each_side_with_its_own_and_compares_them(tmp_path):
    """`parity ab HEAD HEAD --set-a logits_chunk=8`: A's cells compute the loss 8 positions
    at a time, B's whole; the two sides' cells are compared as one (the row has both
    sides' rounds) and the chunk's extra head product shows as B's lower compiled FLOPs."""
    import json

    proc = _stack_ab(tmp_path, "--set-a", "logits_chunk=8", "--no-fail")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {path.stem[-1]: [json.loads(line) for line in path.read_text().splitlines()]
               for path in (tmp_path / "out").glob("ab-*.jsonl")}
    assert {side: {r["spec"].get("logits_chunk", 0) for r in found}
            for side, found in records.items()} == {"A": {8}, "B": {0}}
    text = (tmp_path / "out" / "ab.md").read_text()
    assert "- A's cells with logits_chunk=8" in text
    assert "| 2 / 2 |" in text and "only in" not in text, text
