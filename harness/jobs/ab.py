"""`parity ab REF_A REF_B`: the same cells from two git refs, interleaved round by round.

Each ref is checked out as a detached git worktree (harness.orchestrator.refs); its cells
run with the worktree first on the path, through the worker that ref has, in the current
Python environment or in the software stack given for its side (its own interpreter or site
directory: a jax, flax, optax or libtpu upgrade is then one side of the A/B, like a
commit). By default the two refs' processes of a cell run side by side in lockstep, their
steps alternating in slices (harness.orchestrator.lockstep); with `--pairing processes`,
A's and B's processes of a round run one after the other (A B in even rounds, B A in odd
ones). After each round of a cell the sequential rule looks at its rounds, and a cell whose
verdict more rounds cannot change runs no more (harness.jobs.stopping, reports.sequential);
`--rounds` is the most it runs. `parity ab HEAD HEAD` is the A/A run: it measures the noise
floor.

`Session` is what the A/Bs of one command share (the grid, the pairing, the worktrees and a
compile cache per commit and stack): `parity ab` runs one A/B in it, `parity bisect`
(harness.jobs.bisect) one per step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.contract import CAPTURE_PROTOCOL, LOCKSTEP, PROCESSES, CellRun
from harness.grid import options as grid_options
from harness.jobs.explain import what_changed
from harness.jobs.grid import Grid, OnRecord, Request, Watch, quiet, traced
from harness.jobs.stopping import Judge, Stop, Stopper
from harness.orchestrator.executors import CellProcesses
from harness.orchestrator.lockstep import LockstepPairs
from harness.orchestrator.loop import Sink, Slot, Task, run_tasks, schedule
from harness.orchestrator.refs import (
    Ref,
    Stack,
    Worktrees,
    check_clean,
    check_repo,
    check_stack,
    resolve,
)
from harness.store.layout import OutDir, RunStore, new_run_id
from harness.system.reaper import REAPER
from reports.compare import CellComparison, compare_sets, regressions
from reports.compare import markdown as compare_markdown
from reports.record import ABTag, Record

ROUNDS = 16
STEPS = 10
SLICES = 5
"""Defaults: at most 16 rounds of 10 steps (a cell stops sooner once its verdict is
settled), A's and B's processes in lockstep, their steps in 5 slices. On a 2-core CPU VM
the noise is set by how far a whole process's median moves from the next process's
(6-15%), against a 1-3% standard error of one process's median over 10 steps, so rounds buy
far more than steps; lockstep pairs slices seconds apart, which halves the CI's width
against processes one after the other. The measured MDEs and wall times of
both are in docs/numbers.md ("Lockstep A/B")."""
STACK_FLAGS = {"A": ("--python-a", "--site-a"), "B": ("--python-b", "--site-b")}
"""The options that give each side its software stack (harness.cli)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ABResult:
    """Every record of an A/B run and the per-cell comparison of B against A."""

    records: dict[str, list[Record]]
    """"A" and "B" -> their records, in run order."""
    rows: list[CellComparison]
    shas: dict[str, str]
    lockstep_slices: int = 0
    """The slices of each lockstep round; 0: A's and B's processes ran one after the other."""
    stacks: dict[str, Stack] = dataclasses.field(default_factory=dict)
    """The software stack of each side given one (the others ran in this environment)."""
    stops: list[Stop] = dataclasses.field(default_factory=list)
    """How each cell ended, in the grid's order: the rounds it ran and why no more (its
    sequential rule's last look, harness.jobs.stopping)."""
    sets: dict[str, dict] = dataclasses.field(default_factory=dict)
    """Our decoder's options given to one side's cells ("A" or "B" -> {option: value}): an
    A/B of those options (the same commit may be both sides)."""

    @property
    def slower(self) -> bool:
        """B is slower than A beyond noise in some cell, or costs more in one."""
        return bool(regressions(self.rows))

    def versions(self, side: str) -> dict[str, str | None]:
        """The package versions side `side`'s cells recorded (its first record that has an
        environment; {} where none has)."""
        return next((dict(r.environment.versions) for r in self.records[side]
                     if r.environment is not None), {})


def pairing_for(environment: dict, asked: str | None) -> str:
    """The A/B's pairing on the backend of `environment` (harness.orchestrator.environment):
    `asked`, else lockstep on the CPU and A's and B's processes one after the other on an
    accelerator, where one process at a time holds the chips (a TPU's runtime takes them
    whole). Lockstep asked for on an accelerator is refused (ValueError)."""
    backend = environment.get("backend")
    if asked == LOCKSTEP and backend != "cpu":
        raise ValueError(f"--pairing {LOCKSTEP} runs A's and B's processes side by side, and "
                         f"on this {backend} host one process at a time holds the "
                         f"accelerator; use --pairing {PROCESSES} (the default here)")
    return asked or (LOCKSTEP if backend == "cpu" else PROCESSES)


def precheck(options: dict, pairing: str | None, slices: int) -> None:
    """`check` before anything runs: of `pairing`, or where it is left to the backend
    (None), of whichever pairing it turns out to be when the values suit neither (they are
    refused as lockstep's, the CPU's default); values that suit one are judged once the
    device probe has said which (`pairing_for`)."""
    if pairing is not None:
        check(options, pairing, slices)
        return
    failures = []
    for candidate in (LOCKSTEP, PROCESSES):
        try:
            check(options, candidate, slices)
        except ValueError as err:
            failures.append(err)
    if len(failures) == 2:
        raise failures[0]


def check(options: dict, pairing: str, slices: int) -> None:
    """The A/B's rounds and slicing, before anything runs (harness.grid.options)."""
    grid_options.check_ab_rounds(options["rounds"], pairing, slices)
    if pairing == LOCKSTEP:
        grid_options.check_slices(slices, options["steps"])


class Session:
    """What the A/Bs of one command share: the checked grid, the pairing, whether a cell
    stops once its verdict is settled (`early`: reports.sequential; else it runs every
    round), a temp dir (the reaper removes it should this process be killed), the worktrees
    (one per commit) and a store per commit and stack (its compile caches: a commit's later
    A/Bs load what its first one compiled). Made by `session`."""

    def __init__(self, grid: Grid, pairing: str, slices: int, tmp: Path, trees: Worktrees,
                 early: bool = True):
        self.grid, self.pairing, self.slices, self.early = grid, pairing, slices, early
        self.tmp, self.trees = tmp, trees
        self._stores: dict[tuple[str, Stack], RunStore] = {}

    def _store(self, ref: Ref) -> RunStore:
        """The store of `ref`'s commit in its stack, made when first asked for."""
        key = (ref.sha, ref.stack)
        if key not in self._stores:
            root = self.tmp / f"store-{len(self._stores)}"
            root.mkdir()
            self._stores[key] = RunStore(root)
        return self._stores[key]

    def _sink(self, ref: Ref, ab_id: str) -> Sink:
        """Where one side's records go: OUT/<ab id>-<side>.jsonl, its cells sharing the
        compile caches of its commit and stack (the refs' programs may differ). A worker
        that dies before recording its environment gets the probe's, with the side's
        commit (and, in a stack of its own, no versions: they are the stack's, unknown
        here), so its failure is compared in its cell's row like the other side's runs."""
        run_id = f"{ab_id}-{ref.side}"
        stand_in = {**self.grid.environment, "git_sha": ref.sha, "git_dirty": False,
                    **({"versions": {}} if ref.stack else {})}
        return Sink(path=OutDir(self.grid.out.root).results(run_id), run_id=run_id,
                    store=self._store(ref), env=ref.env(self.grid.env), cwd=ref.tree,
                    ab=ABTag(side=ref.side, sha=ref.sha), environment=stand_in,
                    worker_module=ref.protocol.worker_module, python=ref.stack.python)

    def ab(self, ab_id: str, shas: dict[str, str], *, stacks: dict[str, Stack] | None = None,
           sets: dict[str, dict] | None = None, min_effect: float | None = None,
           watch: Watch = quiet) -> ABResult:
        """B against A: each cell of the grid from both commits (in their stacks), up to
        `rounds` times (schedule's order), A and B of a round side by side in lockstep or
        back to back; the rounds (and, in lockstep, the slices inside them) compared as
        pairs, at `min_effect` (None: the backend's). After each round of a cell the
        sequential rule looks at it, and a cell it settles runs no more rounds (`Stopper`;
        all of them where the session is not `early`). Records go to OUT/<ab id>-A.jsonl
        and -B.jsonl. A ref whose worker times other work (`check_times_trainer`) or cannot
        time in lockstep is refused once checked out. `sets`: our decoder's options for a
        side's cells (`side_cells`), compared across them."""
        stacks = {side: stack for side, stack in (stacks or {}).items() if stack}
        sets = {side: given for side, given in (sets or {}).items() if given}
        cells = side_cells(self.grid.cells, sets)  # refused before any worktree or cell
        refs = {side: self.trees.ref(side, sha, stacks.get(side, Stack()))
                for side, sha in shas.items()}
        lockstep = self.pairing == LOCKSTEP
        check_times_trainer(refs)
        if lockstep:
            check_lockstep(refs)
        sinks = {side: self._sink(ref, ab_id) for side, ref in refs.items()}
        tasks = side_tasks(self.grid, sinks, lockstep=lockstep, cells=cells)
        executor = (LockstepPairs(timeout_s=self.grid.timeout_s, slices=self.slices)
                    if lockstep else
                    # One cell per process and side; an older ref has no zygote.
                    CellProcesses(timeout_s=self.grid.timeout_s, prefork=False))
        stopper = Stopper(judge(min_effect, bool(stacks), bool(sets)),
                          budget=self.grid.rounds,
                          min_rounds=grid_options.first_look(self.pairing, self.slices),
                          early=self.early)
        with watch(self.grid, 2 * len(self.grid.cells) * self.grid.rounds) as (on_start,
                                                                               on_record):
            found = run_tasks(tasks, executor, on_start=on_start,
                              on_record=both(on_record, stopper.on_record), keep=stopper.keep)
        records: dict[str, list[Record]] = {"A": [], "B": []}
        for record in found:
            records[record.ab.side].append(record)
        rows = compare_sets(records["A"], records["B"], paired=True, min_effect=min_effect,
                            across_stacks=bool(stacks), across_options=bool(sets))
        return ABResult(records=records, rows=stopper.decided(rows), shas=dict(shas),
                        lockstep_slices=self.slices if lockstep else 0, stacks=stacks,
                        stops=stopper.stops(), sets=sets)


def judge(min_effect: float | None, across_stacks: bool,
          across_options: bool = False) -> Judge:
    """How a look compares one cell's records: `compare_sets` as the A/B's rows are (paired,
    at `min_effect`, across the stacks' versions where the sides are stacks, across our
    decoder's options where a side was given some), its CIs at the look's confidence; no
    rows where the records have no cell in common (yet)."""

    def compare(a: list[Record], b: list[Record], confidence: float) -> list[CellComparison]:
        try:
            return compare_sets(a, b, paired=True, min_effect=min_effect,
                                across_stacks=across_stacks, across_options=across_options,
                                confidence=confidence)
        except ValueError:
            return []

    return compare


def both(first: OnRecord | None, second: OnRecord) -> OnRecord:
    """One on_record callback calling `first` (where given), then `second`."""

    def called(index: int, record: Record) -> None:
        if first is not None:
            first(index, record)
        second(index, record)

    return called


@contextlib.contextmanager
def session(request: Request, options: dict, *, pairing: str | None, slices: int,
            early: bool = True) -> Iterator[Session]:
    """The grid of `options` (its device probe run), the pairing on its backend
    (`pairing_for`, checked), and the temp dir and worktrees of its A/Bs, all removed on
    the way out (on a stop too); `early`: its cells stop once settled (Session)."""
    grid = Grid(request, options)
    pairing = pairing_for(grid.environment, pairing)
    check(options, pairing, slices)
    with tempfile.TemporaryDirectory(prefix="parity-ab-") as tmp, \
            REAPER.watch("path", path=tmp), Worktrees(Path(tmp)) as trees:
        yield Session(grid, pairing, slices, Path(tmp), trees, early)


def check_stacks(stacks: dict[str, Stack]) -> None:
    """Each side's stack, before anything runs (refs.check_stack, naming `STACK_FLAGS`)."""
    for side, stack in stacks.items():
        check_stack(stack, *STACK_FLAGS[side])


def ab(ref_a: str, ref_b: str, request: Request, options: dict, *,
       pairing: str | None = None, slices: int = SLICES, allow_dirty: bool = False,
       min_effect: float | None = None, stacks: dict[str, Stack] | None = None,
       sets: dict[str, dict] | None = None, early: bool = True,
       watch: Watch = quiet) -> ABResult:
    """Runs each cell of `options` from both refs (`Session.ab`), each side in its stack
    where `stacks` names one and with our decoder's options where `sets` gives that side
    some, a cell stopping once its verdict is settled unless not `early` (--fixed-rounds).
    Bad input fails before any process but git's, the stacks' interpreters and the device
    probe: a repository that is not a checkout, an unknown ref, a ref naming a HEAD with
    uncommitted changes (unless `allow_dirty`), an interpreter that does not run or a site
    directory that is not there, the pairing, rounds and slicing, and options a side's cells
    cannot take."""
    precheck(options, pairing, slices)
    check_stacks(stacks or {})
    check_repo()
    shas = {"A": resolve(ref_a), "B": resolve(ref_b)}
    check_clean([ref_a, ref_b], allow_dirty=allow_dirty)
    with session(request, options, pairing=pairing, slices=slices, early=early) as runs:
        return runs.ab(new_run_id("ab-"), shas, stacks=stacks, sets=sets,
                       min_effect=min_effect, watch=watch)


def check_times_trainer(refs: dict[str, Ref]) -> None:
    """Both refs' workers must time the trainer's own program: a worker of a protocol
    before CAPTURE_PROTOCOL chains the gradient capture into every step it times (a
    parameter-sized copy written each step), which no later worker does, so the two sides
    would time different work."""
    for side, ref in refs.items():
        if ref.protocol.version < CAPTURE_PROTOCOL:
            raise ValueError(f"{side} ({ref.sha[:10]}) times its steps with the gradient "
                             f"capture chained in (its worker speaks protocol "
                             f"{ref.protocol.version}); the other side would time the "
                             f"trainer alone: A/B commits whose worker speaks protocol "
                             f"{CAPTURE_PROTOCOL} or later")


def check_lockstep(refs: dict[str, Ref]) -> None:
    """Both refs' workers must time slices on a parent's signal (protocol 1 and on)."""
    for side, ref in refs.items():
        if not ref.protocol.lockstep:
            raise ValueError(f"{side} ({ref.sha[:10]}) has no lockstep A/B (its worker "
                             f"speaks protocol {ref.protocol.version}): use --pairing "
                             f"{PROCESSES}")


def side_cells(cells: list[CellRun], sets: dict[str, dict]) -> dict[str, list[CellRun]]:
    """Each side's cells: the grid's, and where `sets` gives a side some of our
    decoder's options (attention, its blocks, the logits chunk), that side's cells with
    them (checked: ValueError naming the option or arm that cannot take them)."""
    from arms.registry import resolve as resolve_arm
    from arms.spec import DECODER_OPTIONS, CellSpec

    not_ours = sorted({c.arm for c in cells if resolve_arm(c.arm)[1] != "decoder"})
    found = {}
    for side in ("A", "B"):
        given = sets.get(side) or {}
        unknown = set(given) - set(DECODER_OPTIONS)
        if unknown:
            raise ValueError(f"--set-{side.lower()} {', '.join(sorted(unknown))}: only our "
                             f"decoder's options can differ between the sides "
                             f"({', '.join(DECODER_OPTIONS)})")
        if given and not_ours:
            raise ValueError(f"--set-{side.lower()}: {', '.join(not_ours)} compute their "
                             "own attention and logits (not on our decoder); A/B these "
                             "options with the arms on our decoder")
        found[side] = [dataclasses.replace(c, spec=CellSpec.from_dict({**c.spec, **given})
                                           .to_dict()) if given else c for c in cells]
    return found


def side_tasks(grid: Grid, sinks: dict[str, Sink], *, lockstep: bool,
               cells: dict[str, list[CellRun]] | None = None) -> list[Task]:
    """Per scheduled cell, A's and B's slots (A first in even rounds, B first in odd ones):
    one task of both in lockstep, else a task each; each side's cell from `cells` where
    given (`side_cells`), else the grid's."""
    cells = cells or {side: grid.cells for side in ("A", "B")}
    tasks = []
    for round_index, index, _ in schedule(grid.cells, grid.rounds):
        order = ("A", "B") if round_index % 2 == 0 else ("B", "A")
        slots = tuple(Slot(traced(_round(cells[side][index], round_index),
                                  sinks[side].run_id, round_index),
                           round_index, index, sinks[side]) for side in order)
        tasks += [slots] if lockstep else [(slot,) for slot in slots]
    return tasks


def _round(cell: CellRun, round_index: int) -> CellRun:
    """`cell` as `schedule` runs it in round `round_index` (only round 0 traces and checks)."""
    return cell if not round_index else dataclasses.replace(cell, trace=False, parity=False)


def options_lines(result: ABResult) -> list[str]:
    """What a side given our decoder's options ran, where one was."""
    return [*(f"- {side}'s cells with " + ", ".join(f"{k}={v}" for k, v in given.items())
              for side, given in sorted(result.sets.items())), ""] if result.sets else []


def stack_lines(result: ABResult) -> list[str]:
    """Each side's software, where the sides ran in different stacks or recorded different
    package versions: the stack given and the versions its records carry (those that differ
    from the other side's first)."""
    versions = {side: result.versions(side) for side in ("A", "B")}
    if not result.stacks and versions["A"] == versions["B"]:
        return []
    lines = []
    for side in ("A", "B"):
        mine, theirs = versions[side], versions["B" if side == "A" else "A"]
        named = sorted(mine, key=lambda pkg: (mine.get(pkg) == theirs.get(pkg), pkg))
        listed = ", ".join(f"{pkg} {mine[pkg] or 'absent'}" for pkg in named)
        given = result.stacks.get(side)
        lines.append(f"- {side}: {given.describe() if given else 'this environment'}; "
                     f"recorded versions: {listed or 'none (no cell recorded its own)'}")
    return ["Software stacks (each side's records carry the versions it ran):", *lines, ""]


def rounds_lines(result: ABResult) -> list[str]:
    """How many rounds each cell ran and why no more (`ABResult.stops`)."""
    if not result.stops:
        return []
    how = ("a cell stops once its verdict at the minimum effect cannot change, each look's "
           "CI at a confidence raised for its share of the 5% (reports/sequential.py)"
           if any(stop.look.early for stop in result.stops) else
           "every round run (--fixed-rounds)")
    return [f"Rounds ({how}):", *[f"- {stop.line()}" for stop in result.stops], ""]


def markdown(ref_a: str, ref_b: str, result: ABResult, rounds: int) -> str:
    how = (f"A's and B's processes side by side, their steps alternating in "
           f"{result.lockstep_slices} slices (A B, then B A, ...); rounds, then the slice "
           "pairs inside them, are resampled as pairs." if result.lockstep_slices else
           "A and B back to back (A B, then B A, ...); rounds are resampled as pairs.")
    early = any(stop.look.early for stop in result.stops)
    head = [f"## A/B: {ref_a} (A, {result.shas['A'][:10]}) vs {ref_b} "
            f"(B, {result.shas['B'][:10]})", "",
            f"{'Up to ' if early else ''}{rounds} interleaved rounds, each cell in its own "
            f"process, {how}", "", *rounds_lines(result), *stack_lines(result),
            *options_lines(result)]
    table = compare_markdown(result.rows, old_label="A", new_label="B")
    changed = what_changed(result.rows)
    return "\n".join(head) + "\n" + table + (f"\n{changed}" if changed else "")

