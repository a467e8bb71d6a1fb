"""harness.system.git: the code a record names (the tree of the files that ran, HEAD, and
whether they differ), and harness.jobs.grid.check_code, which refuses a run whose records
could not name the commit that ran."""

import subprocess

import pytest

from harness.jobs.grid import ALLOW_DIRTY, check_code
from harness.system import git


def _repo(path):
    def run(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              cwd=path, check=True, capture_output=True, text=True
                              ).stdout.strip()

    run("init", "-q")
    (path / ".gitignore").write_text("results/\n")
    (path / "code.py").write_text("x = 1\n")
    run("add", ".")
    run("commit", "-qm", "one")
    return run


def test_a_clean_checkout_names_its_commit_and_that_commits_tree(tmp_path):
    run = _repo(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "r.jsonl").write_text("{}\n")  # ignored: not code
    state = git.state(tmp_path)
    assert state == {"git_sha": run("rev-parse", "HEAD"), "git_dirty": False,
                     "git_tree": run("rev-parse", "HEAD^{tree}")}


def test_changed_and_untracked_files_are_dirty_and_named_by_their_tree(tmp_path):
    run = _repo(tmp_path)
    head, index = run("rev-parse", "HEAD"), (tmp_path / ".git" / "index").read_bytes()
    (tmp_path / "code.py").write_text("x = 2\n")
    changed = git.state(tmp_path)
    assert changed["git_sha"] == head and changed["git_dirty"]
    (tmp_path / "new.py").write_text("y = 1\n")  # untracked, not ignored: it may run
    both = git.state(tmp_path)
    assert both["git_dirty"] and both["git_tree"] != changed["git_tree"]
    # the checkout's own index and HEAD are untouched
    assert (tmp_path / ".git" / "index").read_bytes() == index
    assert run("rev-parse", "HEAD") == head and run("diff", "--cached") == ""
    # the tree names exactly these files: committing them gives the same tree
    run("add", ".")
    run("commit", "-qm", "two")
    assert run("rev-parse", "HEAD^{tree}") == both["git_tree"]
    assert git.state(tmp_path) == {"git_sha": run("rev-parse", "HEAD"), "git_dirty": False,
                                   "git_tree": both["git_tree"]}


def test_a_git_directory_that_lags_its_files_is_not_read_as_that_commit(tmp_path):
    """The TPU host's copy once carried a `.git` older than the files beside it: the records
    named the old commit (dirty) for a later commit's code. The state says dirty, and its
    tree is the later commit's."""
    run = _repo(tmp_path)
    old = run("rev-parse", "HEAD")
    (tmp_path / "code.py").write_text("x = 3\n")
    run("commit", "-qam", "later")
    later_tree = run("rev-parse", "HEAD^{tree}")
    run("reset", "-q", "--soft", old)  # .git back at the old commit, the files the later's
    state = git.state(tmp_path)
    assert state["git_sha"] == old and state["git_dirty"]
    assert state["git_tree"] == later_tree


def test_a_run_from_files_that_are_not_its_commits_is_refused_unless_allowed(tmp_path,
                                                                             monkeypatch):
    monkeypatch.delenv(ALLOW_DIRTY, raising=False)
    _repo(tmp_path)
    check_code(repo=tmp_path)  # clean: nothing to refuse
    (tmp_path / "code.py").write_text("x = 2\n")
    with pytest.raises(ValueError) as refused:
        check_code(repo=tmp_path)
    message = str(refused.value)
    assert "the checkout's files are not its HEAD commit's" in message
    assert "commit them, or pass --allow-dirty (PARITY_ALLOW_DIRTY=1)" in message
    assert "\n" not in message
    check_code(allow_dirty=True, repo=tmp_path)
    monkeypatch.setenv(ALLOW_DIRTY, "1")
    check_code(repo=tmp_path)


def test_outside_a_git_checkout_nothing_is_named(tmp_path):
    assert git.state(tmp_path) == {"git_sha": None, "git_dirty": None, "git_tree": None}
