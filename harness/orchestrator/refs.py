"""Two git refs checked out side by side for `parity ab`, and the worker each one has.

Each ref is a detached git worktree in a temp dir, registered with the reaper before it is
made (a parent killed mid-`git worktree add` leaves nothing) and removed on the way out.
Cells of a ref run in the current Python environment with its worktree first on the path,
so the ref's own engine, arms and worker run, reached through the contract that worker
speaks (`Protocol`): a ref with harness.contract says its version and worker module
itself; an older ref has the worker `harness.worker`, which speaks version 1 (lockstep
included) from the commit that added lockstep on, version 0 before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from harness.system import git
from harness.system.reaper import REAPER

LEGACY_WORKER = "harness.worker"
"""The worker module of commits before harness.contract."""
LOCKSTEP_COMMIT = "5c93e43580fea6d7076ef88e4acf32a33a34362d"
"""The commit whose `harness.worker` first took `--gate-fd` (lockstep, protocol 1)."""
LOCKSTEP_PROTOCOL = 1
"""The first protocol version with lockstep."""


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The contract a ref's worker speaks (harness.contract.PROTOCOL)."""

    version: int
    worker_module: str

    @property
    def lockstep(self) -> bool:
        return self.version >= LOCKSTEP_PROTOCOL


@dataclasses.dataclass(frozen=True)
class Ref:
    """One side of an A/B: its commit, its worktree and its worker."""

    side: str
    sha: str
    tree: Path
    protocol: Protocol

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with this ref's worktree first on the path."""
        path = os.pathsep.join([str(self.tree), base.get("PYTHONPATH", "")])
        return {**base, "PYTHONPATH": path.rstrip(os.pathsep)}


def check_repo(repo: Path = git.REPO) -> None:
    """`ab` checks refs out of the git repository parity runs from."""
    try:
        git.git("rev-parse", "--show-toplevel", cwd=repo)
    except git.GitError as err:
        raise ValueError(f"parity ab needs a git checkout of parity, and {repo} is not one "
                         f"({err}); run it from a clone") from None


def resolve(ref: str, repo: Path = git.REPO) -> str:
    """The commit `ref` names; ValueError naming the fix when it names none."""
    try:
        return git.git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
    except git.GitError:
        raise ValueError(f"unknown git ref {ref!r} in {repo}; give a branch, tag or commit "
                         "(see `git log --oneline`)") from None


def check_clean(refs: list[str], repo: Path = git.REPO, allow_dirty: bool = False) -> None:
    """A ref naming the checked-out commit would silently leave out uncommitted changes."""
    if allow_dirty:
        return
    head = git.git("rev-parse", "HEAD", cwd=repo)
    dirty = git.git("status", "--porcelain", "--untracked-files=no", cwd=repo)
    if dirty and any(resolve(r, repo) == head for r in refs):
        raise ValueError("the working tree has uncommitted changes, and a worktree of HEAD "
                         "would not include them: commit or stash them (or pass "
                         "--allow-dirty to measure HEAD as committed)")


def protocol_of(tree: Path, sha: str, repo: Path = git.REPO) -> Protocol:
    """The contract the worker of the commit checked out at `tree` speaks."""
    if not (tree / "harness" / "contract.py").is_file():
        version = LOCKSTEP_PROTOCOL if git.is_ancestor(LOCKSTEP_COMMIT, sha, repo) else 0
        return Protocol(version, LEGACY_WORKER)
    said = subprocess.run(
        [sys.executable, "-c", "import json, harness.contract as c; "
         "print(json.dumps([c.PROTOCOL, c.WORKER_MODULE]))"],
        cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
        text=True, timeout=120)
    if said.returncode != 0:
        raise ValueError(f"{sha[:10]}'s harness.contract does not import: "
                         f"{said.stderr.strip()[-300:]}")
    version, module = json.loads(said.stdout.strip().splitlines()[-1])
    return Protocol(int(version), module)


@contextlib.contextmanager
def checked_out(shas: dict[str, str], root: Path,
                repo: Path = git.REPO) -> Iterator[dict[str, Ref]]:
    """Each side's commit as a detached worktree under `root`, removed on the way out (also
    on Ctrl-C and SIGTERM, and by the reaper should this process be killed)."""
    trees: dict[str, Path] = {}
    with contextlib.ExitStack() as watching:
        try:
            for side, sha in shas.items():
                trees[side] = root / side
                watching.enter_context(REAPER.watch("worktree", path=str(trees[side]),
                                                    repo=str(repo)))
                git.add_worktree(trees[side], sha, repo)
            yield {side: Ref(side, sha, trees[side], protocol_of(trees[side], sha, repo))
                   for side, sha in shas.items()}
        finally:
            for tree in trees.values():
                git.remove_worktree(tree, repo)
