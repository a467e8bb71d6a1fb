"""`parity ab REF_A REF_B`: the same cells from two git refs, interleaved A B A B.

Each ref is checked out as a detached git worktree; its cells run in the current Python
environment with the worktree first on the path (so the ref's own engine, arms and worker
run). `parity ab HEAD HEAD` is the A/A run: it measures the noise floor.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import regression
from harness.console import cell_name
from harness.environment import REPO
from harness.runner import run_grid
from harness.worker import CellRun
from reports.record import ABTag, Spec, section


def _git(*args: str, cwd: Path = REPO) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout.strip()


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


@dataclasses.dataclass
class ABRow:
    cell: str
    a_median: float
    b_median: float
    comparison: regression.Comparison

    min_effect: float = regression.MIN_EFFECT

    @property
    def verdict(self) -> str:
        return regression.verdict(self.comparison, self.min_effect)


def run_ab(ref_a: str, ref_b: str, cells: Sequence[CellRun], out_dir: Path, *,
           env: dict[str, str], timeout_s: float, rounds: int = 3, repo: Path = REPO,
           on_record: Callable[[int, dict], None] | None = None,
           min_effect: float = regression.MIN_EFFECT) -> list[ABRow]:
    if rounds < 3:
        raise ValueError(f"--rounds {rounds}: A/B needs at least 3 interleaved rounds")
    shas = {"A": resolve_ref(ref_a, repo), "B": resolve_ref(ref_b, repo)}
    samples: dict[tuple[str, int], list[list[float]]] = {}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="parity-ab-") as tmp:
        trees = {}
        for side, sha in shas.items():
            trees[side] = Path(tmp) / side
            _git("worktree", "add", "--detach", str(trees[side]), sha, cwd=repo)
        try:
            for round_index in range(rounds):
                for side in ("A", "B"):
                    side_env = dict(env)
                    side_env["PYTHONPATH"] = os.pathsep.join(
                        [str(trees[side]), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
                    _, records = run_grid(cells, out_dir, env=side_env, timeout_s=timeout_s,
                                          run_id=f"ab-r{round_index}-{side}",
                                          cwd=trees[side], on_record=on_record,
                                          ab=ABTag(side=side, sha=shas[side],
                                                   round=round_index))
                    for i, record in enumerate(records):
                        if record.ok:
                            samples.setdefault((side, i), []).append(record.timing.step_ms)
                        else:
                            failed.append(f"{side} round {round_index}: "
                                          f"{cell_name(record.arm, record.spec)}: "
                                          f"{record.error.message}")
        finally:
            for tree in trees.values():
                _git("worktree", "remove", "--force", str(tree), cwd=repo)
    if failed:
        raise RuntimeError("A/B cells failed:\n" + "\n".join(failed))
    rows = []
    for i, cell in enumerate(cells):
        a, b = samples[("A", i)], samples[("B", i)]
        c = regression.compare(a, b)
        name = cell_name(cell.arm, section(Spec, cell.spec))
        rows.append(ABRow(name, _median(a), _median(b), c, min_effect))
    return rows


def _median(groups: list[list[float]]) -> float:
    pooled = sorted(x for g in groups for x in g)
    mid = len(pooled) // 2
    return pooled[mid] if len(pooled) % 2 else (pooled[mid - 1] + pooled[mid]) / 2


def markdown(ref_a: str, ref_b: str, rows: Sequence[ABRow], rounds: int) -> str:
    min_effect = rows[0].min_effect if rows else regression.MIN_EFFECT
    lines = [
        f"## A/B: {ref_a} (A) vs {ref_b} (B)", "",
        f"{rounds} interleaved rounds (A B A B ...), each cell in its own process. Ratio = "
        "median B / median A (above 1.00: B is slower); 95% CI from a bootstrap over rounds "
        "and steps; a verdict needs the CI to exclude 1.00 and a difference of at least "
        f"{min_effect:.0%}; MDE = the smallest relative difference these samples "
        "can detect.", "",
        "| cell | A median ms | B median ms | B/A [95% CI] | verdict | MDE |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        c = r.comparison
        lines.append(f"| {r.cell} | {r.a_median:.2f} | {r.b_median:.2f} | {c.ratio:.3f} "
                     f"[{c.low:.3f}, {c.high:.3f}] | {r.verdict} | {c.mde:.1%} |")
    flagged = sum(r.verdict != "no detectable difference" for r in rows)
    lines += ["", f"{flagged} of {len(rows)} cells differ beyond noise."]
    return "\n".join(lines) + "\n"
