"""`parity bisect GOOD BAD`: the first commit after GOOD whose cell is slower than GOOD's
beyond noise by at least the minimum effect.

A binary search (`search`) over BAD's first-parent history after GOOD, each step an A/B of
one commit against GOOD at the one cell given: `parity ab`'s machinery (harness.jobs.ab's
`Session`, whose worktrees and compile caches are kept across steps, GOOD's reused by every
step). BAD is measured first: where it is not slower there is nothing to find. The search
ends where the last commit not slower (or GOOD) and the first slower one are adjacent; that
commit is named with what differs between it and its parent (harness.jobs.explain, from the
records the steps made), the cause the two A/Bs support, and the `parity ab` line that
measures the commit against its parent (`repro`).
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from collections.abc import Callable

from harness.grid.expand import expand
from harness.jobs.ab import SLICES, ABResult, Session, precheck, session
from harness.jobs.explain import cell_change
from harness.jobs.grid import Request, Watch, quiet
from harness.orchestrator.refs import Stack, check_clean, check_repo, check_stack, resolve
from harness.store.layout import new_run_id
from harness.system import git
from reports import cause, stats
from reports.compare import FAILED, FIXED, ONLY_NEW, ONLY_OLD

GOOD = -1
"""`search`'s index of GOOD itself (the commits are 0 .. count - 1)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Step:
    """One A/B of the search: GOOD (A) against one commit (B)."""

    number: int
    """1 for BAD, then 2, 3, ... in the order they ran."""
    sha: str
    subject: str
    """The first line of the commit's message."""
    result: ABResult

    @property
    def slower(self) -> bool:
        """The commit's cell is slower than GOOD's beyond noise, by the minimum effect."""
        return any(row.verdict == stats.SLOWER for row in self.result.rows)

    @property
    def unjudged(self) -> str:
        """Why the step cannot say slower or not (a side failed), '' where it can."""
        return "; ".join(f"{row.name}: {row.verdict}" for row in self.result.rows
                         if row.verdict in (FAILED, FIXED, ONLY_OLD, ONLY_NEW))

    @property
    def rounds(self) -> str:
        """How many rounds the step's cell ran and why no more, e.g. 'settled: slower beyond
        the 1% minimum effect after 4 of 16 rounds' (its A/B's `stops`)."""
        return "; ".join(stop.look.reason() for stop in self.result.stops)

    def line(self) -> str:
        """'1a2b3c4d5e subject (settled: slower beyond the 5% minimum effect after 2 of 16
        rounds): 1.100 [1.050, 1.150] (99.77% CI): slower' (each cell's verdict last)."""
        said = "; ".join(stats.describe(row.timing) if row.timing else row.verdict
                         for row in self.result.rows)
        rounds = f" ({self.rounds})" if self.rounds else ""
        return f"{self.sha[:10]} {self.subject}{rounds}: {said}"


class Unjudged(Exception):  # noqa: N818 - a step that says nothing, not a fault
    """A step whose cell failed on a side: the search cannot go on from it."""

    def __init__(self, step: Step):
        super().__init__(step.unjudged)
        self.step = step


@dataclasses.dataclass(frozen=True, kw_only=True)
class Bisection:
    """What a bisection found."""

    good: str
    bad: str
    commits: list[str]
    """BAD's first-parent history after GOOD, oldest first, BAD last."""
    steps: list[Step]
    first: int | None
    """The index in `commits` of the first slower commit; None where none was found (BAD
    not slower, or a step `unjudged`)."""
    unjudged: Step | None = None
    """The step whose cell failed, where the search stopped at one."""

    @property
    def parent(self) -> str | None:
        """The first slower commit's parent (GOOD for the first commit of the range)."""
        if self.first is None:
            return None
        return self.good if self.first == 0 else self.commits[self.first - 1]


def search(count: int, slower: Callable[[int], bool]) -> int | None:
    """The index of the first slower commit of `count` (oldest first, the last one BAD),
    asking `slower(index)` of as few as a binary search needs: BAD first (None where it is
    not slower), then the middle of the commits still undecided, until the last one not
    slower (or GOOD) and the first slower one are adjacent. Measured slowdowns are taken to
    stay once they appear (a commit after a slower one is slower)."""
    if not slower(count - 1):
        return None
    good, bad = GOOD, count - 1
    while bad - good > 1:
        middle = (good + bad) // 2
        if slower(middle):
            bad = middle
        else:
            good = middle
    return bad


def most_steps(count: int) -> int:
    """The A/Bs a search of `count` commits runs at most: BAD, then ceil(log2(count))."""
    return 1 + math.ceil(math.log2(count)) if count > 1 else 1


def commit_range(good: str, bad: str, repo=git.REPO) -> tuple[str, str, list[str]]:
    """(GOOD's commit, BAD's, the commits between: BAD's first-parent history after GOOD,
    oldest first); ValueError naming the fix where the refs are unknown, the same commit,
    in the wrong order, or GOOD is not on BAD's first-parent history."""
    shas = resolve(good, repo), resolve(bad, repo)
    if shas[0] == shas[1]:
        raise ValueError(f"GOOD {good} and BAD {bad} are the same commit ({shas[0][:10]}); "
                         "give an older GOOD, a commit whose cell was not slower")
    if not git.is_ancestor(shas[0], shas[1], repo):
        raise ValueError(f"GOOD {good} ({shas[0][:10]}) is not an ancestor of BAD {bad} "
                         f"({shas[1][:10]}): give the older, good commit first")
    commits = git.first_parent_path(shas[0], shas[1], repo)
    if not commits or git.first_parent(commits[0], repo) != shas[0]:
        raise ValueError(f"GOOD {good} ({shas[0][:10]}) is not on BAD's first-parent history "
                         f"(a merged branch's commit); give a GOOD from `git log "
                         f"--first-parent --oneline {bad}`")
    return shas[0], shas[1], commits


def check_cell(options: dict) -> None:
    """A bisection times one cell: the grid's options must expand to exactly one."""
    found = expand(options)
    if len(found) != 1:
        raise ValueError(f"parity bisect times one cell, and these options make "
                         f"{len(found)}: give --arms, --preset, --seq, --batch and --ga one "
                         "value each")


def bisect(good: str, bad: str, request: Request, options: dict, *,
           pairing: str | None = None, slices: int = SLICES, allow_dirty: bool = False,
           min_effect: float | None = None, stack: Stack | None = None,
           watch: Watch = quiet, on_step: Callable[[Step, int], None] | None = None,
           early: bool = True) -> Bisection:
    """Searches BAD's first-parent history after GOOD for the first commit whose one cell
    is slower than GOOD's (`search`), each step an A/B at `min_effect` (None: the
    backend's), both sides in `stack` where given, each stopping once its verdict is settled
    unless not `early` (harness.jobs.stopping); `on_step(step, most)` hears of each step as
    it ends (`most`: the steps the search may take). Bad input fails before anything
    runs but git, the stack's interpreter and the device probe: unknown refs, a range that
    cannot be searched, a grid of more than one cell, a dirty HEAD named (unless
    `allow_dirty`), an interpreter or site directory that is not there, the pairing."""
    precheck(options, pairing, slices)
    check_cell(options)
    stacks = {"A": stack, "B": stack} if stack else {}
    if stack:
        check_stack(stack, "--python", "--site")
    check_repo()
    good_sha, bad_sha, commits = commit_range(good, bad)
    check_clean([good, bad], allow_dirty=allow_dirty)
    steps: list[Step] = []
    with session(request, options, pairing=pairing, slices=slices, early=early) as runs:
        measure = _measurer(runs, good_sha, commits, steps, new_run_id("bisect-"),
                            {"stacks": stacks, "min_effect": min_effect, "watch": watch},
                            on_step)
        try:
            first = search(len(commits), measure)
        except Unjudged as stop:
            return Bisection(good=good_sha, bad=bad_sha, commits=commits, steps=steps,
                             first=None, unjudged=stop.step)
    return Bisection(good=good_sha, bad=bad_sha, commits=commits, steps=steps, first=first)


def _measurer(runs: Session, good: str, commits: list[str], steps: list[Step],
              bisect_id: str, ab_options: dict,
              on_step: Callable[[Step, int], None] | None) -> Callable[[int], bool]:
    """`search`'s question for commit `index`: an A/B of it against GOOD, kept in `steps`;
    Unjudged where its cell failed on a side."""

    def slower(index: int) -> bool:
        sha = commits[index]
        number = len(steps) + 1
        result = runs.ab(f"{bisect_id}-{number}", {"A": good, "B": sha}, **ab_options)
        step = Step(number=number, sha=sha, subject=git.subject(sha), result=result)
        steps.append(step)
        if on_step is not None:
            on_step(step, most_steps(len(commits)))
        if step.unjudged:
            raise Unjudged(step)
        return step.slower

    return slower


def _records_of(found: Bisection, index: int) -> list:
    """The ok records of commit `index` (GOOD's for `GOOD`): B's of the step that measured
    it; GOOD's are A's of the first slower commit's step."""
    if index == GOOD:
        step = next(s for s in found.steps if s.sha == found.commits[found.first])
        return [r for r in step.result.records["A"] if r.ok]
    step = next(s for s in found.steps if s.sha == found.commits[index])
    return [r for r in step.result.records["B"] if r.ok]


def _step_of(found: Bisection, sha: str) -> Step | None:
    return next((s for s in found.steps if s.sha == sha), None)


def explanation(found: Bisection) -> str:
    """What differs between the first slower commit and its parent (the steps' records:
    harness.jobs.explain.cell_change), and the cause the two A/Bs support: the commit, the
    one change between a parent not slower than GOOD and a child slower than it."""
    if found.first is None:
        return ""
    first = found.commits[found.first]
    old, new = _records_of(found, found.first - 1), _records_of(found, found.first)
    text = cell_change(old, new) or (
        "Neither side carries its compiled step by category or a traced window: run the "
        "cell with --trace to see which operations differ.\n")
    slower = _step_of(found, first).result.rows[0].timing
    parent = _step_of(found, found.parent)
    before = (f"its parent {found.parent[:10]} against GOOD: "
              f"{stats.describe(parent.result.rows[0].timing)}" if parent else
              "its parent is GOOD itself")
    return (f"{cause.DIFFERS}\n\n{text}\n**Cause**: the commit {first[:10]} "
            f"({git.subject(first)}) moved the time: against GOOD {found.good[:10]} it is "
            f"{stats.describe(slower)}, where {before}.\n")


def repro(found: Bisection, request: Request, extra: list[str] = ()) -> str:
    """The one-line `parity ab` that measures the first slower commit against its parent
    at the cell bisected (`extra`: the A/B options given, e.g. ['--pairing', 'processes'])."""
    return shlex.join(["parity", "ab", found.parent, found.commits[found.first],
                       *request.argv(), *extra])


def markdown(good: str, bad: str, found: Bisection, request: Request,
             extra: list[str] = ()) -> str:
    """The bisection as a PR can carry it: its steps, the commit found, what differs and
    the cause, and the line that reproduces it."""
    lines = [f"## Bisect: {good} ({found.good[:10]}) .. {bad} ({found.bad[:10]}), "
             f"{len(found.commits)} commits", "",
             "Each step: an A/B of one commit (B) against GOOD (A); slower = beyond noise by "
             "at least the minimum effect (reports.stats); rounds: how many it ran and why no "
             "more (reports.sequential: a step stops once its verdict is settled, its CI "
             "then at the confidence named).", "",
             "| step | commit | subject | rounds | B / GOOD [CI]: verdict |",
             "|---|---|---|---|---|"]
    for step in found.steps:
        said = "; ".join(stats.describe(row.timing) if row.timing else row.verdict
                         for row in step.result.rows)
        lines.append(f"| {step.number} | {step.sha[:10]} | {step.subject} | "
                     f"{step.rounds or '-'} | {said} |")
    lines.append("")
    if found.unjudged is not None:
        lines.append(f"Stopped at {found.unjudged.sha[:10]}: its cell did not run on a side "
                     f"({found.unjudged.unjudged}); bisect a range that runs.")
    elif found.first is None:
        lines.append(f"BAD {bad} is not slower than GOOD {good} by the minimum effect: "
                     "nothing to bisect.")
    else:
        first = found.commits[found.first]
        lines += [f"First slower commit: **{first[:10]}** ({git.subject(first)}), parent "
                  f"{found.parent[:10]}.", "", f"### What differs: {first[:10]} against its "
                  "parent", "", explanation(found).rstrip("\n"), "",
                  "Reproduce (the commit against its parent):", "",
                  f"    {repro(found, request, extra)}"]
    return "\n".join(lines) + "\n"
