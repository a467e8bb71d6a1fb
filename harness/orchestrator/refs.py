"""Git refs checked out side by side for `parity ab` and `parity bisect`, the worker each
one has, and the software stack each side runs in.

Each commit is a detached git worktree in a temp dir, registered with the reaper before it
is made (a parent killed mid-`git worktree add` leaves nothing) and removed on the way out.
Cells of a ref run in the current Python environment (or its side's `Stack`) with its
worktree first on the path, so the ref's own engine, arms and worker run, reached through
the contract that worker speaks (`Protocol`): a ref with harness.contract says its version
and worker module itself; an older ref has the worker `harness.worker`, which speaks
version 1 (lockstep included) from the commit that added lockstep on, version 0 before it.
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


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stack:
    """The software a side's cells run in: an interpreter and a site directory of its own,
    so that two versions of jax, flax, optax or libtpu are the two sides of an A/B."""

    python: str | None = None
    """The Python interpreter its workers run in (its own site-packages); None: this
    process's."""
    site: str | None = None
    """A directory of packages put on the path before the interpreter's own (e.g. `pip
    install --target DIR flax==X`), so its versions are the ones imported; None: none."""

    def __bool__(self) -> bool:
        return self.python is not None or self.site is not None

    def describe(self) -> str:
        """'python /x/bin/python, site /y' ('' for this process's own)."""
        return ", ".join(f"{name} {value}" for name, value in (("python", self.python),
                                                                ("site", self.site)) if value)


def check_stack(stack: Stack, python_flag: str, site_flag: str) -> None:
    """A stack's interpreter must run and its site directory exist; ValueError naming the
    option (`python_flag`, `site_flag`) and the fix, before anything runs."""
    if stack.python is not None:
        try:
            said = subprocess.run([stack.python, "-c", "import sys; print(sys.version_info[0])"],
                                  capture_output=True, text=True, timeout=60)
        except OSError as err:
            raise ValueError(f"{python_flag} {stack.python}: cannot run it "
                             f"({err.strerror or err}); give a Python interpreter's path "
                             "(e.g. a venv's bin/python)") from None
        if said.returncode != 0 or said.stdout.strip() != "3":
            raise ValueError(f"{python_flag} {stack.python}: not a Python 3 interpreter; "
                             "give one's path (e.g. a venv's bin/python)")
    if stack.site is not None and not Path(stack.site).is_dir():
        raise ValueError(f"{site_flag} {stack.site}: no such directory; give a directory of "
                         "packages (pip install --target DIR ...)")


@dataclasses.dataclass(frozen=True)
class Ref:
    """One side of an A/B: its commit, its worktree, its worker and its software stack."""

    side: str
    sha: str
    tree: Path
    protocol: Protocol
    stack: Stack = Stack()

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with this ref's worktree first on the path, then its stack's site
        directory."""
        path = os.pathsep.join([str(self.tree), *([self.stack.site] if self.stack.site else []),
                                base.get("PYTHONPATH", "")])
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


class Worktrees:
    """Detached worktrees of commits under `root`, one per commit, each made when first asked
    for (`ref`) and reused after (a bisect's GOOD in every step), all removed on the way out
    (also on Ctrl-C and SIGTERM, and by the reaper should this process be killed: each is
    registered with it before it is made)."""

    def __init__(self, root: Path, repo: Path = git.REPO):
        self.root, self.repo = root, repo
        self._made: dict[str, tuple[Path, Protocol]] = {}
        self._watching = contextlib.ExitStack()

    def __enter__(self) -> Worktrees:
        self._watching.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            for tree, _ in self._made.values():
                git.remove_worktree(tree, self.repo)
        finally:
            self._watching.__exit__(*exc)

    def ref(self, side: str, sha: str, stack: Stack = Stack()) -> Ref:
        """Side `side` of commit `sha` in `stack`, its worktree made where there is none."""
        if sha not in self._made:
            tree = self.root / sha
            self._watching.enter_context(REAPER.watch("worktree", path=str(tree),
                                                      repo=str(self.repo)))
            self._made[sha] = (tree, None)  # removed on the way out even if add fails midway
            git.add_worktree(tree, sha, self.repo)
            self._made[sha] = (tree, protocol_of(tree, sha, self.repo))
        tree, protocol = self._made[sha]
        return Ref(side, sha, tree, protocol, stack)


@contextlib.contextmanager
def checked_out(shas: dict[str, str], root: Path, repo: Path = git.REPO,
                stacks: dict[str, Stack] | None = None) -> Iterator[dict[str, Ref]]:
    """Each side's commit (in its stack, where `stacks` names one) as a detached worktree
    under `root`, one per commit, removed on the way out (`Worktrees`)."""
    with Worktrees(root, repo) as trees:
        yield {side: trees.ref(side, sha, (stacks or {}).get(side, Stack()))
               for side, sha in shas.items()}
