"""A grid command's cells, checked before anything runs: what `run`, `plan`, `nightly`,
`ab` and `launch` share.

Every bad value fails here, first what needs no device (`check`: value ranges, arms, presets,
shapes, ragged counts, the mesh's syntax, plugins, the output directory), with no process
started and nothing written; then (`Grid`), after one short probe process reports the
devices, the mesh against them, and an existing results file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections.abc import Callable
from pathlib import Path

from harness.contract import CellRun
from harness.grid import options as grid_options
from harness.grid.expand import expand
from harness.orchestrator.environment import cell_environment
from harness.orchestrator.loop import recorded, slot_key
from harness.store import results
from harness.store.layout import OutDir, cell_path, check_run_id, new_run_id
from harness.system import git
from reports.record import Record

OnStart = Callable[[CellRun, int], None]
"""Called as a cell starts: (cell, round)."""
OnRecord = Callable[[int, Record], None]
"""Called as a cell's record is kept: (the cell's index in the grid, record)."""
Watch = Callable[["Grid", int], contextlib.AbstractContextManager[tuple[OnStart | None,
                                                                         OnRecord | None]]]
"""What a command's caller sees of a grid run: given the grid and the cells about to run,
a context held while they run that yields the (on_start, on_record) callbacks (the command
line's progress lines, and what a stop leaves)."""


@contextlib.contextmanager
def quiet(grid: Grid, total: int):
    """A Watch that shows nothing."""
    yield None, None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """What a grid command was asked for, before any check."""

    explicit: dict
    """Grid options given explicitly (None where not given)."""
    suite: str | None = None
    plugins: tuple[str, ...] = ()
    """Modules registering extra arms, imported first."""
    out: Path
    """The out directory (nightly: the history)."""


    def argv(self) -> list[str]:
        """The grid arguments that ask for this request (harness.cli.grid_args reads them
        back into an equal Request): what a printed command line repeats."""
        found = [*(["--suite", self.suite] if self.suite else []),
                 *[arg for module in self.plugins for arg in ("--plugin", module)]]
        for key, value in self.explicit.items():
            if value is None:
                continue
            if key in SWITCHES:
                found.append(f"--{'' if value else 'no-'}{SWITCHES[key]}")
            elif key in ("parity", "fit_check"):  # only ever given as off
                found.append(f"--no-{key.replace('_', '-')}")
            elif key == "fit_bytes":
                found += ["--fit-gib", repr(value / 2**30)]
            else:
                found += [FLAGS.get(key, f"--{key.replace('_', '-')}"),
                          ",".join(map(str, value)) if isinstance(value, list) else str(value)]
        return found


FLAGS = {"timeout_s": "--timeout", "wait_s": "--wait-for-device"}
"""Request.explicit keys whose option is not the key with '-' for '_'."""
SWITCHES = {"scan_layers": "scan-layers", "trace": "trace", "trace_hlo": "trace-hlo"}
"""Keys given as --NAME / --no-NAME."""


ALLOW_DIRTY = "PARITY_ALLOW_DIRTY"
"""Set to 1, the environment variable that stands for `--allow-dirty` in every command of a
session (a developer's edit-and-run loop; the test suite)."""


def check_code(allow_dirty: bool = False, repo: Path = git.REPO) -> None:
    """Refuses, with one line naming the fix, a run whose records could not name the code
    that ran: a checkout whose files (tracked, and untracked ones git does not ignore) are
    not its HEAD commit's. A record names the commit whose files ran, or the run does not
    record. `allow_dirty` (or ALLOW_DIRTY=1): record them anyway, as uncommitted changes on
    HEAD, each record naming the tree of its files (`environment.git_tree`)."""
    if allow_dirty or os.environ.get(ALLOW_DIRTY) == "1":
        return
    state = git.state(repo)
    if state["git_dirty"]:
        sha, tree = state["git_sha"][:10], (state["git_tree"] or "?")[:10]
        raise ValueError(
            f"the checkout's files are not its HEAD commit's ({sha}), so no record could "
            f"name the code that ran: commit them, or pass --allow-dirty ({ALLOW_DIRTY}=1) to "
            f"record them as uncommitted changes on {sha} (files tree {tree})")


def check(request: Request, processes: int = 1, defaults: dict | None = None, *,
          allow_dirty: bool = False) -> dict:
    """The grid's options, every value checked that needs no device: no process is started
    and nothing is written (a probe file in `out` is created and removed), but git's
    reading of the checkout (`check_code`, last) and, where a MaxText arm is named, the
    import check of arms.requirements."""
    for module in request.plugins:
        _import_plugin(module)
    options = grid_options.merge(request.explicit, suite=request.suite, defaults=defaults)
    options = set_aside_unavailable(options, named=request.explicit.get("arms") or ())
    if processes > 1 and not options.get("mesh"):
        options["mesh"] = grid_options.MULTI_PROCESS_MESH
    grid_options.check(options)
    expand(options)
    results.check_writable(request.out)
    if options.get("trace"):
        results.check_writable(OutDir(request.out).traces, "--trace: the traces directory")
    check_code(allow_dirty)
    return options


def set_aside_unavailable(options: dict, named=(), found=None) -> dict:
    """`options` with the arms this environment cannot run (arms.registry.unavailable) moved
    from "arms" to "unavailable" (arm -> why), where a suite or the default named them;
    ValueError, one line naming the packages, for one the command line named (`named`).
    `found`: what to judge by (arms.requirements.Found; default: this environment)."""
    from arms.registry import resolve, unavailable

    arms = list(options.get("arms") or [])
    for arm in arms:
        resolve(arm)  # an unknown arm is refused as unknown, first
    why = {arm: reason for arm in arms if (reason := unavailable(arm, found))}
    refused = [arm for arm in named if arm in why]
    if refused:
        arm = refused[0]
        raise ValueError(f"arm {arm} cannot run in this environment: {why[arm]} (`parity "
                         "arms` lists the arms and what each needs)")
    if why and len(why) == len(arms):
        raise ValueError("no arm of the grid can run in this environment: " + "; ".join(
            f"{arm}: {reason}" for arm, reason in why.items()))
    if not why:
        return options
    return {**options, "arms": [a for a in arms if a not in why], "unavailable": why}


def arm_table(found=None) -> str:
    """`parity arms`: every named arm, what it is, and whether it runs here (or why not)."""
    from arms.registry import MODELS, NAMED_ARMS, TRAINERS, unavailable

    rows = ["| arm | trainer | model | runs here |", "|---|---|---|---|"]
    for arm, (trainer, model) in NAMED_ARMS.items():
        why = unavailable(arm, found)
        rows.append(f"| {arm} | {TRAINERS[trainer].about} | {MODELS[model]} | "
                    f"{'no: ' + why if why else 'yes'} |")
    return "\n".join(rows)


class Grid:
    """A grid command's checked cells, the environment they run in and the results file
    they go to. `target`: plan every cell for this TPU topology instead of running it
    (harness.xla.target.describe), its meshes checked against the target's devices."""

    def __init__(self, request: Request, options: dict, *, processes: int = 1,
                 run_id: str | None = None, target: dict | None = None):
        if run_id is not None:
            check_run_id(run_id)
        self.options, self.out = options, OutDir(request.out)
        self.run_id = run_id or new_run_id()
        self.path = self.out.results(self.run_id, self.options.get("name"))
        results.check_appendable(self.path)
        self.env, self.environment = cell_environment(
            self.options.get("cpu_devices"), planning=target is not None,
            wait_s=self.options.get("wait_s") or 0.0)
        self.target = target
        available = {**self.environment,
                     "device_count": self.environment["device_count"] * processes}
        planned = {}
        if target is not None:
            available = {"target": target["target"], "device_count": target["device_count"]}
            planned = {"plan_target": target["target"], "plan_slices": target["slices"],
                       "plan_libtpu": target["libtpu"], "trace": False, "parity": False,
                       "plan_cache": target.get("plan_cache")}
        # Absolute: cells may run elsewhere (an A/B worktree) and records outlive the cwd.
        trace_dir = str(self.out.traces.absolute()) if self.options.get("trace") else None
        self.cells = [dataclasses.replace(c, trace_dir=trace_dir, plugins=request.plugins,
                                          **planned)
                      for c in expand(self.options, mesh_sizes=available)]
        skipped = self.options.get("unavailable") or {}
        self.unrun = [(c, skipped[c.arm]) for c in expand(
            {**self.options, "arms": list(skipped)}, mesh_sizes=available,
            allow_empty=True)] if skipped else []
        """The cells of the arms this environment cannot run, and why (not run: recorded
        as `unavailable`)."""
        if target is not None and target.get("save_hlo"):
            self.cells = [dataclasses.replace(c, plan_hlo_dir=str(
                (self.out.hlo / cell_path(self.run_id, c.arm, c.spec)).absolute()))
                for c in self.cells]
        self.timeout_s = self.options.get("timeout_s", 600)

    @property
    def rounds(self) -> int:
        return self.options.get("rounds", 1)

    @property
    def where(self) -> str:
        """Where the cells run, in words."""
        if self.target:
            return (f"planned for {self.target['target']} ({self.target['device_count']} x "
                    f"{self.target['device_kind']}, compiled on this host)")
        return (f"on {self.environment['backend']} ({self.environment['device_count']} x "
                f"{self.environment['device_kind']})")

    def recorded(self) -> int:
        """Slots of this grid (each cell's rounds, each unrun cell's one record) its results
        file already holds under its run id: what a resumed run skips. Records of other
        cells under the same id (another shape or arm run into the same file) are not this
        grid's and are not counted."""
        slots = {slot_key(c, r) for c in self.cells for r in range(self.rounds)}
        slots |= {slot_key(c, 0) for c, _ in self.unrun}
        return len(slots & recorded(self.path, self.run_id))


def traced(cell: CellRun, run_id: str, round_index: int) -> CellRun:
    """`cell` with the directory of its capture (where it traces)."""
    if not cell.trace:
        return cell
    return dataclasses.replace(cell, trace_session=cell_path(run_id, cell.arm, cell.spec,
                                                             round_index))


def _import_plugin(module: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"--plugin {module}: cannot import it ({err}); give a module on "
                         "PYTHONPATH that registers arms") from None
