"""git, as parity uses it: the commit records are stamped with, and the detached worktrees
`parity ab` runs each ref from. Standard library only (the reaper imports it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout parity runs from."""


class GitError(ValueError):
    """A git command failed; the message is git's own."""


def git(*args: str, cwd: Path = REPO, timeout_s: float | None = None) -> str:
    """git's stdout (stripped); GitError with git's stderr when it fails."""
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                              timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise GitError(f"git {' '.join(args)} did not run: {err}") from None
    if proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def state(repo: Path = REPO) -> dict:
    """{"git_sha", "git_dirty"} of the checkout (None where it is not a git checkout)."""
    try:
        sha = git("rev-parse", "HEAD", cwd=repo, timeout_s=10)
        dirty = git("status", "--porcelain", "--untracked-files=no", cwd=repo, timeout_s=10)
    except GitError:
        return {"git_sha": None, "git_dirty": None}
    return {"git_sha": sha, "git_dirty": bool(dirty)}


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
