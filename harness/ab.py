"""`parity ab REF_A REF_B`: the same cells from two git refs, interleaved round by round.

Each ref is checked out as a detached git worktree; its cells run in the current Python
environment with the worktree first on the path (so the ref's own engine, arms and worker
run). `parity ab HEAD HEAD` is the A/A run: it measures the noise floor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.environment import REPO
from harness.reaper import REAPER
from harness.runner import new_run_id, run_grid, schedule
from harness.worker import CellRun
from reports import stats
from reports.compare import CellComparison, compare_sets, regressions
from reports.compare import markdown as compare_markdown
from reports.record import ABTag, Record


def _git(*args: str, cwd: Path = REPO) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


def check_repo(repo: Path = REPO) -> None:
    """`ab` checks refs out of the git repository parity runs from."""
    try:
        _git("rev-parse", "--show-toplevel", cwd=repo)
    except ValueError as err:
        raise ValueError(f"parity ab needs a git checkout of parity, and {repo} is not one "
                         f"({err}); run it from a clone") from None


def resolve_ref(ref: str, repo: Path = REPO) -> str:
    try:
        return _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", cwd=repo)
    except ValueError:
        raise ValueError(f"unknown git ref {ref!r} in {repo}; give a branch, tag or commit "
                         "(see `git log --oneline`)") from None


def check_clean(refs: Sequence[str], repo: Path = REPO, allow_dirty: bool = False) -> None:
    """A ref naming the checked-out commit would silently leave out uncommitted changes."""
    if allow_dirty:
        return
    head = _git("rev-parse", "HEAD", cwd=repo)
    dirty = _git("status", "--porcelain", "--untracked-files=no", cwd=repo)
    if dirty and any(resolve_ref(r, repo) == head for r in refs):
        raise ValueError("the working tree has uncommitted changes, and a worktree of HEAD "
                         "would not include them: commit or stash them (or pass "
                         "--allow-dirty to measure HEAD as committed)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ABResult:
    """Every record of an A/B run and the per-cell comparison of B against A."""

    records: dict[str, list[Record]]
    """"A" and "B" -> their records, in run order."""
    rows: list[CellComparison]
    shas: dict[str, str]

    @property
    def slower(self) -> bool:
        """B is slower than A beyond noise in some cell, or costs more in one."""
        return bool(regressions(self.rows))


def run_ab(ref_a: str, ref_b: str, cells: Sequence[CellRun], out_dir: Path, *,
           env: dict[str, str], timeout_s: float, rounds: int = 5, repo: Path = REPO,
           on_record: Callable[[int, Record], None] | None = None,
           on_start: Callable[[CellRun, int], None] | None = None,
           min_effect: float = stats.MIN_EFFECT) -> ABResult:
    """Runs each cell from both refs, `rounds` times, A and B back to back (A B in even
    rounds, B A in odd ones) so machine drift hits both sides of a round alike; the rounds
    are then compared as pairs. Records go to out_dir/<ab id>-A.jsonl and -B.jsonl."""
    if rounds < stats.MIN_PAIRS:
        raise ValueError(f"--rounds {rounds}: A/B needs at least {stats.MIN_PAIRS} rounds "
                         "(fewer interleaved pairs cannot reach 95% confidence)")
    shas = {"A": resolve_ref(ref_a, repo), "B": resolve_ref(ref_b, repo)}
    ab_id = new_run_id("ab-")
    records: dict[str, list[Record]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="parity-ab-") as tmp, \
            REAPER.watch("path", path=tmp), contextlib.ExitStack() as watching:
        trees = {}
        try:
            for side, sha in shas.items():
                trees[side] = Path(tmp) / side
                # Registered first: a parent killed mid-`git worktree add` leaves nothing.
                watching.enter_context(REAPER.watch("worktree", path=str(trees[side]),
                                                    repo=str(repo)))
                _git("worktree", "add", "--detach", str(trees[side]), sha, cwd=repo)
            for round_index, index, cell in schedule(cells, rounds):
                for side in ("A", "B") if round_index % 2 == 0 else ("B", "A"):
                    side_env = dict(env)
                    side_env["PYTHONPATH"] = os.pathsep.join(
                        [str(trees[side]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                    _, (record,) = run_grid([cell], out_dir, env=side_env,
                                            timeout_s=timeout_s, run_id=f"{ab_id}-{side}",
                                            cwd=trees[side], first_round=round_index,
                                            ab=ABTag(side=side, sha=shas[side]),
                                            on_start=on_start,
                                            # One cell per call: a zygote would serve
                                            # one cell, and an older ref has none.
                                            store=Path(tmp) / f"store-{side}",
                                            prefork=False)
                    records[side].append(record)
                    if on_record:
                        on_record(index, record)
        finally:  # also on Ctrl-C and SIGTERM (harness.reaper.Terminated)
            for tree in trees.values():
                if tree.exists():
                    _git("worktree", "remove", "--force", str(tree), cwd=repo)
            _git("worktree", "prune", cwd=repo)
    rows = compare_sets(records["A"], records["B"], paired=True, min_effect=min_effect)
    return ABResult(records=records, rows=rows, shas=shas)


def markdown(ref_a: str, ref_b: str, result: ABResult, rounds: int,
             min_effect: float = stats.MIN_EFFECT) -> str:
    head = [f"## A/B: {ref_a} (A, {result.shas['A'][:10]}) vs {ref_b} "
            f"(B, {result.shas['B'][:10]})", "",
            f"{rounds} interleaved rounds, each cell in its own process, A and B back to back "
            "(A B, then B A, ...); rounds are resampled as pairs.", ""]
    return "\n".join(head) + compare_markdown(result.rows, old_label="A", new_label="B",
                                              min_effect=min_effect)
