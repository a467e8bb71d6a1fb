"""git, as parity uses it: the commit records are stamped with, and the detached worktrees
`parity ab` runs each ref from. Standard library only (the reaper imports it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout parity runs from."""


class GitError(ValueError):
    """A git command failed; the message is git's own."""


def git(*args: str, cwd: Path = REPO, timeout_s: float | None = None,
        env: dict[str, str] | None = None) -> str:
    """git's stdout (stripped); GitError with git's stderr when it fails."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GitError(f"git {' '.join(args)} did not run: {err}") from None
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def files_tree(repo: Path = REPO, timeout_s: float = 30) -> str:
    """The git tree id of the checkout's files as they are now: tracked files as on disk and
    untracked ones git does not ignore (a new module that ran is part of the code), hashed
    through a copy of the index so that the checkout's own index and HEAD are untouched (the
    blobs of changed files are written to the object store, as `git stash create` does). Equal
    to HEAD's tree exactly when the files are HEAD's."""
    with tempfile.TemporaryDirectory(prefix="parity-git-") as tmp:
        index = Path(tmp) / "index"
        own = Path(git("rev-parse", "--git-path", "index", cwd=repo, timeout_s=timeout_s))
        own = own if own.is_absolute() else repo / own
        if own.exists():  # its stat cache spares hashing the files that did not change
            shutil.copyfile(own, index)
        env = {**os.environ, "GIT_INDEX_FILE": str(index)}
        git("add", "--all", "--", ".", cwd=repo, timeout_s=timeout_s, env=env)
        return git("write-tree", cwd=repo, timeout_s=timeout_s, env=env)


def state(repo: Path = REPO) -> dict:
    """{"git_sha", "git_dirty", "git_tree"} of the checkout: HEAD, whether the files that
    run are not HEAD's (`files_tree` differs from HEAD's tree), and the tree of those files,
    which names them exactly either way (all None where it is not a git checkout)."""
    try:
        sha = git("rev-parse", "HEAD", cwd=repo, timeout_s=10)
        head_tree = git("rev-parse", "HEAD^{tree}", cwd=repo, timeout_s=10)
    except GitError:
        return {"git_sha": None, "git_dirty": None, "git_tree": None}
    try:
        tree = files_tree(repo)
    except GitError:  # e.g. an object store this user cannot write: tracked files only
        changed = git("status", "--porcelain", "--untracked-files=no", cwd=repo, timeout_s=10)
        return {"git_sha": sha, "git_dirty": bool(changed), "git_tree": None}
    return {"git_sha": sha, "git_dirty": tree != head_tree, "git_tree": tree}


def is_ancestor(ancestor: str, commit: str, repo: Path = REPO) -> bool:
    """Whether `ancestor` is `commit` or one of its ancestors (False where git cannot tell,
    e.g. an ancestor absent from a shallow clone)."""
    proc = subprocess.run(["git", "merge-base", "--is-ancestor", ancestor, commit], cwd=repo,
                          capture_output=True)
    return proc.returncode == 0


def first_parent_path(good: str, bad: str, repo: Path = REPO) -> list[str]:
    """The commits of `bad`'s first-parent history after `good`, oldest first, `bad` last
    (each one's first parent the one before it, the first one's `good`, where `good` is on
    that history)."""
    listed = git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}", cwd=repo)
    return listed.split()


def subject(sha: str, repo: Path = REPO) -> str:
    """The first line of a commit's message."""
    return git("log", "-1", "--format=%s", sha, cwd=repo)


def first_parent(sha: str, repo: Path = REPO) -> str | None:
    """A commit's first parent (None for a root commit)."""
    try:
        return git("rev-parse", "--verify", "--quiet", f"{sha}^1", cwd=repo)
    except GitError:
        return None


def add_worktree(path: Path, sha: str, repo: Path = REPO) -> None:
    """A detached worktree of `sha` at `path`."""
    git("worktree", "add", "--detach", str(path), sha, cwd=repo)


def remove_worktree(path: Path, repo: Path = REPO) -> None:
    """Removes the worktree at `path` (if git still has it) and prunes git's list; never
    raises (it runs on the way out of a stopped run, and in the reaper)."""
    subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=repo,
                   capture_output=True)
    subprocess.run(["git", "worktree", "prune"], cwd=repo, capture_output=True)
