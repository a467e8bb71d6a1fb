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
    lockstep_slices: int = 0
    """The slices of each lockstep round; 0: A's and B's processes ran one after the other."""

    @property
    def slower(self) -> bool:
        """B is slower than A beyond noise in some cell, or costs more in one."""
        return bool(regressions(self.rows))


def run_ab(ref_a: str, ref_b: str, cells: Sequence[CellRun], out_dir: Path, *,
           env: dict[str, str], timeout_s: float, rounds: int = 5, repo: Path = REPO,
           on_record: Callable[[int, Record], None] | None = None,
           on_start: Callable[[CellRun, int], None] | None = None,
           min_effect: float = stats.MIN_EFFECT, lockstep_slices: int = 0) -> ABResult:
    """Runs each cell from both refs, `rounds` times, A and B back to back (A B in even
    rounds, B A in odd ones) so machine drift hits both sides of a round alike; the rounds
    are then compared as pairs. With `lockstep_slices`, A's and B's processes of a round
    run side by side and their steps alternate in that many slices (harness.lockstep);
    the slice pairs are compared (a ref whose worker predates lockstep is refused). Records
    go to out_dir/<ab id>-A.jsonl and -B.jsonl."""
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
            if lockstep_slices:
                check_lockstep(trees, shas)
            refs = _Refs(trees=trees, shas=shas, ab_id=ab_id, stores=Path(tmp), env=env)
            for round_index, index, cell in schedule(cells, rounds):
                order = ("A", "B") if round_index % 2 == 0 else ("B", "A")
                if lockstep_slices:
                    found = _lockstep_round(refs, cell, round_index, order, lockstep_slices,
                                            out_dir, timeout_s, on_start)
                    done = [found[side] for side in order]
                else:  # each side's record as its process ends
                    done = (run_grid([cell], out_dir, env=refs.env_of(side),
                                     timeout_s=timeout_s, run_id=refs.run_id(side),
                                     cwd=trees[side], first_round=round_index,
                                     ab=refs.tag(side), on_start=on_start,
                                     store=refs.store(side),
                                     # One cell per call: a zygote would serve one cell,
                                     # and an older ref has none.
                                     prefork=False)[1][0] for side in order)
                for record in done:
                    records[record.ab.side].append(record)
                    if on_record:
                        on_record(index, record)
        finally:  # also on Ctrl-C and SIGTERM (harness.reaper.Terminated)
            for tree in trees.values():
                if tree.exists():
                    _git("worktree", "remove", "--force", str(tree), cwd=repo)
            _git("worktree", "prune", cwd=repo)
    rows = compare_sets(records["A"], records["B"], paired=True, min_effect=min_effect)
    return ABResult(records=records, rows=rows, shas=shas, lockstep_slices=lockstep_slices)


def check_lockstep(trees: dict[str, Path], shas: dict[str, str]) -> None:
    """Both refs' workers must time slices on a parent's signal (`--gate-fd`)."""
    for side, tree in trees.items():
        worker = tree / "harness" / "worker.py"
        if "--gate-fd" not in (worker.read_text() if worker.exists() else ""):
            raise ValueError(f"{side} ({shas[side][:10]}) predates lockstep A/B (its "
                             "harness.worker has no --gate-fd): use --pairing processes")


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Refs:
    """The two refs' checkouts, as their cells run from them."""

    trees: dict[str, Path]
    shas: dict[str, str]
    ab_id: str
    stores: Path
    """Where each side keeps what its cells share over rounds (a compile cache per side:
    the refs' programs may differ)."""
    env: dict[str, str]

    def env_of(self, side: str) -> dict[str, str]:
        """The cells' environment with the side's worktree first on the path."""
        path = os.pathsep.join([str(self.trees[side]), self.env.get("PYTHONPATH", "")])
        return {**self.env, "PYTHONPATH": path.rstrip(os.pathsep)}

    def store(self, side: str) -> Path:
        return self.stores / f"store-{side}"

    def run_id(self, side: str) -> str:
        return f"{self.ab_id}-{side}"

    def tag(self, side: str) -> ABTag:
        return ABTag(side=side, sha=self.shas[side])


def _lockstep_round(refs: _Refs, cell: CellRun, round_index: int, order: Sequence[str],
                    slices: int, out_dir: Path, timeout_s: float,
                    on_start: Callable[[CellRun, int], None] | None) -> dict[str, Record]:
    """One round of a cell in lockstep (`order[0]` times first): both sides' records,
    stamped and appended to their results files."""
    from harness import results
    from harness.lockstep import LOCKSTEP, run_pair
    from harness.runner import cell_store, results_path, stamp

    sides = {}
    for side in order:
        refs.store(side).mkdir(parents=True, exist_ok=True)
        sides[side] = ({**refs.env_of(side), **cell_store(refs.store(side), cell)},
                       refs.trees[side])
        if on_start:
            on_start(cell, round_index)
    found = run_pair(cell, slices, sides, timeout_s)
    for side, record in found.items():
        stamp(record, cell, run_id=refs.run_id(side), suite=None, round_index=round_index,
              env=refs.env_of(side), environment=None, ab=refs.tag(side))
        record.run.pairing = [LOCKSTEP]
        path = results_path(out_dir, refs.run_id(side))
        with results.exclusive(path):
            results.append(path, record)
    return found


def markdown(ref_a: str, ref_b: str, result: ABResult, rounds: int,
             min_effect: float = stats.MIN_EFFECT) -> str:
    how = (f"A's and B's processes side by side, their steps alternating in "
           f"{result.lockstep_slices} slices (A B, then B A, ...); rounds, then the slice "
           "pairs inside them, are resampled as pairs." if result.lockstep_slices else
           "A and B back to back (A B, then B A, ...); rounds are resampled as pairs.")
    head = [f"## A/B: {ref_a} (A, {result.shas['A'][:10]}) vs {ref_b} "
            f"(B, {result.shas['B'][:10]})", "",
            f"{rounds} interleaved rounds, each cell in its own process, {how}", ""]
    return "\n".join(head) + compare_markdown(result.rows, old_label="A", new_label="B",
                                              min_effect=min_effect)
