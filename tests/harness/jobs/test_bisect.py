"""harness.jobs.bisect: the search, the range it searches and what it refuses, and (slow) a
real bisection of a clone of this repository with a planted slowdown, found by `parity
bisect` through `parity ab`'s machinery."""

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.jobs import bisect
from harness.jobs.grid import Request
from tests.harness.cli_helpers import REPO, cli_env, parity_main

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


@pytest.mark.parametrize("count", range(1, 10))
def test_the_search_finds_the_first_slower_commit_in_the_fewest_questions(count):
    for planted in range(count):
        asked = []

        def slower(index, planted=planted, asked=asked):
            asked.append(index)
            return index >= planted

        assert bisect.search(count, slower) == planted
        assert asked[0] == count - 1  # BAD first
        assert len(asked) <= bisect.most_steps(count)
        assert len(set(asked)) == len(asked)  # no commit measured twice
    asked = []
    assert bisect.search(count, lambda i: asked.append(i) or False) is None
    assert asked == [count - 1]  # BAD not slower: nothing more is measured


def _commit(repo: Path, message: str) -> str:
    """An empty commit, tagged with its message."""
    subprocess.run([*GIT, "commit", "-q", "--allow-empty", "-m", message], cwd=repo,
                   check=True)
    subprocess.run(["git", "tag", message], cwd=repo, check=True)
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                          text=True, check=True).stdout.strip()


@pytest.fixture
def history(tmp_path):
    """A repository: root, a, b, c on main, and a branch `side` from a with one commit x,
    merged into main as d (d's first parent c, second x); each commit tagged by name."""
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    shas = {name: _commit(repo, name) for name in ("root", "a")}
    subprocess.run(["git", "checkout", "-q", "-b", "side"], cwd=repo, check=True)
    shas["x"] = _commit(repo, "x")
    subprocess.run(["git", "checkout", "-q", "main"], cwd=repo, check=True)
    shas.update({name: _commit(repo, name) for name in ("b", "c")})
    subprocess.run([*GIT, "merge", "-q", "--no-ff", "-m", "d", "side"], cwd=repo, check=True)
    shas["d"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True,
                               text=True, check=True).stdout.strip()
    return repo, shas


def test_the_range_is_bads_first_parent_history_after_good(history):
    repo, shas = history
    good, bad, commits = bisect.commit_range("a", "main", repo)
    assert (good, bad) == (shas["a"], shas["d"])
    assert commits == [shas["b"], shas["c"], shas["d"]]  # the branch's x is not searched
    assert bisect.commit_range("a", "b", repo)[2] == [shas["b"]]


@pytest.mark.parametrize(("good", "bad", "message"), [
    ("nope", "main", "unknown git ref 'nope'"),
    ("main", "main", "are the same commit"),
    ("main", "a", "is not an ancestor of BAD a"),
    ("side", "main", "is not on BAD's first-parent history (a merged branch's commit); give "
                     "a GOOD from `git log --first-parent --oneline main`"),
])
def test_a_range_that_cannot_be_searched_is_refused_naming_the_fix(history, good, bad,
                                                                    message):
    repo, _ = history
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bisect.commit_range(good, bad, repo)


def test_a_grid_of_more_than_one_cell_is_refused():
    from harness.jobs.grid import check

    two = check(Request(explicit={"arms": ["native", "engine"], "preset": ["tiny"],
                                  "seq": [16], "batch": [4], "ga": [1]}, out=Path("x")))
    with pytest.raises(ValueError, match="parity bisect times one cell, and these options "
                                         "make 2: give --arms"):
        bisect.check_cell(two)
    bisect.check_cell({**two, "arms": ["native"]})


def test_a_request_s_command_line_reads_back_as_the_same_request(tmp_path):
    """Request.argv, which the bisect's reproducing line and the nightly's bisect hint
    print, parses (by the command line's own parser) into an equal request."""
    import argparse

    from harness.cli.grid_args import add_grid_arguments, request

    explicit = {
        "arms": ["native"], "preset": ["tiny"], "seq": [16, 32], "batch": [4],
        "micro_batch": None, "ga": [1, 4], "steps": 9, "warmup": 2, "rounds": 6,
        "dtype": "bfloat16", "mesh": "fsdp=2", "loss": "xent", "optimizer": "sgd",
        "ragged": [8, 4, 2, 2], "timeout_s": 120.5, "cpu_devices": 2, "trace_steps": 3,
        "scan_layers": False, "remat": "full", "trace": True, "trace_hlo": False,
        "parity": False, "loss_agg_mode": None, "beta": None, "epsilon": 0.3,
        "epsilon_high": None, "epsilon_c": None, "fit_check": False,
        "fit_bytes": int(1.7 * 2**30), "wait_s": 30.0, "attention": "splash",
        "attention_block_q": 256, "attention_block_kv": 512, "logits_chunk": 128,
        "scan_backward": "unfilled"}
    wanted = Request(explicit=explicit, suite="cpu-default",
                     plugins=("tests.harness.fault_arms",), out=tmp_path)
    parser = argparse.ArgumentParser()
    add_grid_arguments(parser)
    assert request(parser.parse_args(wanted.argv()), tmp_path) == wanted
    bare = Request(explicit=dict.fromkeys(explicit), out=tmp_path)
    assert bare.argv() == []


def test_bisect_refuses_bad_refs_and_ranges_with_one_line_and_exit_2(tmp_path, capsys,
                                                                     monkeypatch):
    monkeypatch.chdir(REPO)  # the refs are this checkout's
    cell = ["--arms", "native", "--preset", "tiny", "--seq", "16", "--batch", "4", "--ga",
            "1", "--out", str(tmp_path / "out")]
    same = parity_main(capsys, "bisect", "HEAD", "HEAD", *cell)
    assert same.returncode == 2
    assert same.stderr.startswith("parity: error: GOOD HEAD and BAD HEAD are the same "
                                  "commit") and same.stderr.count("\n") == 1
    unknown = parity_main(capsys, "bisect", "no-such-ref", "HEAD", *cell)
    assert unknown.returncode == 2 and "unknown git ref 'no-such-ref'" in unknown.stderr
    two = parity_main(capsys, "bisect", "HEAD~1", "HEAD", *cell, "--arms", "native,engine")
    assert two.returncode == 2 and "parity bisect times one cell" in two.stderr
    assert not (tmp_path / "out").exists()  # nothing written


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A clone of this repository with three commits on top: a README edit, a commit that
    makes the native arm's step 3x as long (a busy spin, tests.harness.fault_arms), and
    another README edit."""
    clone = tmp_path_factory.mktemp("bisect") / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    shutil.copy(REPO / "tests/harness/fault_arms.py", clone / "tests/harness/fault_arms.py")
    shas = []
    for change in ("readme", "slow", "readme"):
        if change == "readme":
            readme = clone / "README.md"
            readme.write_text(readme.read_text() + "\nan edit\n")
        else:
            native = clone / "arms" / "native.py"
            native.write_text(native.read_text() + (
                "\n\nimport tests.harness.fault_arms as _faults  # noqa: E402\n"
                "_faults._slow_down(NativeArm, 2.0)\n"))
        subprocess.run([*GIT, "add", "-A"], cwd=clone, check=True)
        subprocess.run([*GIT, "commit", "-qm", f"{change} {len(shas)}"], cwd=clone,
                       check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone,
                                   capture_output=True, text=True, check=True).stdout.strip())
    return clone, shas


CELL = ["--arms", "native", "--preset", "tiny", "--seq", "128", "--batch", "8", "--ga", "1",
        "--steps", "15", "--warmup", "2", "--no-parity"]


@pytest.mark.slow  # three A/Bs of 2 lockstep rounds: 12 cell processes
def test_bisect_names_the_planted_commit_explains_it_and_prints_its_ab(planted):
    clone, (readme, slow, last) = planted
    out = clone / "bisect-out"
    # A 3x step against a 50% minimum effect: far beyond any process-to-process spread of
    # this machine, so each step's verdict is the plant's, not the machine's luck.
    ab = ["--rounds", "2", "--slices", "3", "--threshold", "0.5"]
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bisect", "HEAD~3", "HEAD",
                           *CELL, *ab, "--out", str(out)], cwd=clone,
                          env=dict(cli_env(), PYTHONPATH=str(clone)), capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    steps = [line for line in proc.stdout.splitlines() if line.startswith("parity bisect:")]
    # BAD first (slower), then the middle of the three (the README edit: not slower), then
    # the planted commit (slower): three A/Bs, as many as a search of 3 commits may take.
    assert [line.split(": ", 2)[1] for line in steps] == [
        "step 1 (of at most 3)", "step 2 (of at most 3)", "step 3 (of at most 3)"]
    assert [line.split(": ", 2)[2].split()[0] for line in steps] == [
        last[:10], readme[:10], slow[:10]]
    labels = [line.rsplit(": ", 1)[1] for line in steps]
    assert labels[0] == labels[2] == "slower" and labels[1] not in ("slower", "faster")
    text = (out / "bisect.md").read_text()
    assert proc.stdout.endswith(text + "\n")
    assert f"First slower commit: **{slow[:10]}** (slow 1), parent {readme[:10]}." in text
    assert f"### What differs: {slow[:10]} against its parent" in text
    # the plant spins on the host: the compiled step is the same in every category
    assert "The compiled step is the same in every category" in text
    assert f"**Cause**: the commit {slow[:10]} (slow 1) moved the time: against GOOD" in text
    repro = next(line.strip() for line in text.splitlines()
                 if line.strip().startswith("parity ab "))
    # the A/B of the commit against its parent, at the very cell and options bisected
    from harness.cli import build_parser
    from harness.cli.grid_args import request

    again = build_parser(only="ab").parse_args(shlex.split(repro)[1:])
    given = build_parser(only="bisect").parse_args(["bisect", "HEAD~3", "HEAD", *CELL, *ab])
    assert (again.ref_a, again.ref_b) == (readme, slow)
    assert request(again, out) == request(given, out)
    assert (again.threshold, again.slices, again.pairing) == (0.5, 3, None)
    # every step's records: GOOD and the commit, 2 rounds each
    assert len(list(out.glob("bisect-*-A.jsonl"))) == len(list(out.glob("bisect-*-B.jsonl"))) \
        == 3
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=clone, capture_output=True,
                               text=True, check=True).stdout
    assert worktrees.count("\n") == 1  # the clone's own; every step's worktree removed


@pytest.mark.slow  # one A/B of 2 lockstep rounds
def test_bisect_of_a_range_that_is_not_slower_says_so_and_exits_1(planted):
    clone, (readme, _, _) = planted
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "bisect", "HEAD~3", readme,
                           *CELL, "--rounds", "2", "--slices", "3", "--threshold", "0.5",
                           "--out", str(clone / "not-slower")], cwd=clone,
                          env=dict(cli_env(), PYTHONPATH=str(clone)), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (f"BAD {readme} is not slower than GOOD HEAD~3 by the minimum effect: nothing to "
            "bisect.") in proc.stdout
    assert proc.stdout.count("parity bisect: step") == 1


def test_a_nightly_regression_between_two_commits_prints_the_bisect_that_finds_it(tmp_path):
    """Two nights of separate runs name a range of commits, not a cause: the nightly prints
    the `parity bisect` of that range at the regressed cell, with the night's options."""
    import dataclasses

    from harness.cli import build_parser
    from harness.cli.grid_args import request
    from harness.jobs import nightly
    from tests.reports.helpers import fixture_records, with_rounds, write

    native = next(r for r in fixture_records(("native",)) if r.ok)

    def night(run_id, sha, median_ms):
        return [dataclasses.replace(r, run_id=run_id, timestamp=run_id,
                                    environment=dataclasses.replace(
                                        r.environment, git_sha=sha, git_dirty=False))
                for r in with_rounds(native, median_ms, rounds=4)]

    old, new = night("n1", "a" * 40, 10.0), night("n2", "b" * 40, 20.0)
    write([*old, *new], tmp_path / "history" / "h.jsonl")
    asked = Request(explicit={"steps": 8, "rounds": 4}, suite="cpu-default",
                    out=tmp_path / "history")
    code, text = nightly.evaluate(new, tmp_path / "history", threshold=None,
                                  report_dir=tmp_path / "report", request=asked)
    assert code == nightly.EXIT_REGRESSION
    assert "Cause: none claimed: the sides differ in" not in text  # one change: the commit
    assert "**Cause**: the commit aaaaaaaaaa -> bbbbbbbbbb moved the time" in text
    line = next(line.strip() for line in text.splitlines()
                if line.strip().startswith("parity bisect "))
    args = build_parser(only="bisect").parse_args(shlex.split(line)[1:])
    assert (args.good, args.bad) == ("a" * 40, "b" * 40)
    spec = native.spec
    assert request(args, tmp_path / "history") == Request(
        explicit={**dict.fromkeys(request(args, tmp_path).explicit), "arms": ["native"],
                  "preset": [spec.preset], "seq": [spec.seq], "batch": [spec.batch],
                  "ga": [spec.ga], "steps": 8}, suite="cpu-default", out=tmp_path / "history")
    # the same night without a request (a caller that has none) prints no bisect line
    _, bare = nightly.evaluate(new, tmp_path / "history", threshold=None,
                               report_dir=tmp_path / "report")
    assert "parity bisect " not in bare
