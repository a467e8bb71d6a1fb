"""What the grid commands (run, nightly, ab, launch) share: their arguments, their options,
their validation and the one way they run cells.

`Grid` checks every value before anything runs (first what needs no device, with no process
started and nothing written; then, after one probe process, the mesh against the devices) and
runs the cells with progress lines; a signal ends a run with one line saying what is kept
(`Stopped`).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable
from pathlib import Path

DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def _csv(kind):
    """An argparse type: comma-separated values of `kind`, each named when it is bad."""
    names = {int: "a whole number", str: "a name"}

    def parse(text: str) -> list:
        values = []
        for item in (x.strip() for x in text.split(",")):
            if not item:
                continue
            try:
                values.append(kind(item))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{item!r} is not {names[kind]}") from None
        return values

    parse.__name__ = f"list of {kind.__name__}"
    return parse


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    from arms.registry import arms_help
    from arms.spec import OPTIMIZERS
    from arms.workload import LOSSES
    from engine.model.config import REMAT_POLICIES
    from harness.grid import suite_names

    parser.add_argument("--suite", help=f"named suite ({', '.join(suite_names())}); other "
                                        "options override it")
    parser.add_argument("--arms", type=_csv(str), help=f"comma-separated arms: {arms_help()}")
    parser.add_argument("--preset", type=_csv(str), help="model preset(s)")
    parser.add_argument("--seq", type=_csv(int), help="sequence length(s)")
    parser.add_argument("--batch", type=_csv(int), help="global batch size(s) per step")
    parser.add_argument("--ga", type=_csv(int), help="gradient-accumulation step(s)")
    parser.add_argument("--steps", type=int, help="timed steps per cell")
    parser.add_argument("--rounds", type=int,
                        help="times each cell runs, each a separate process, interleaved "
                             "(A B C, C B A, ...); default: the suite's, else 1")
    parser.add_argument("--warmup", type=int, help="untimed warmup steps (>= 1)")
    parser.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                        help="capture a separate traced window after timing")
    parser.add_argument("--trace-steps", type=int, help="steps in the traced window")
    parser.add_argument("--trace-hlo", action=argparse.BooleanOptionalAction, default=None,
                        help="capture the traced window with the HLO proto, so xprof's "
                             "memory_viewer and graph_viewer work (~1.5x bigger traces; "
                             "implies --trace unless --no-trace is given)")
    parser.add_argument("--mesh", help="mesh, e.g. fsdp=8 or fsdp=4,tensor=2")
    parser.add_argument("--dtype", choices=[*DTYPES, *DTYPES.values()], help="compute dtype")
    parser.add_argument("--loss", choices=list(LOSSES), help="workload loss")
    parser.add_argument("--optimizer", choices=list(OPTIMIZERS), help="optax optimizer")
    parser.add_argument("--ragged", type=_csv(int), help="loss tokens per micro-batch, e.g. "
                                                         "64,16,40,8 (applies where GA matches)")
    parser.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--remat", choices=list(REMAT_POLICIES))
    parser.add_argument("--timeout", type=float, help="seconds before a cell is killed")
    parser.add_argument("--cpu-devices", type=int, help="emulate N CPU devices (CPU backend)")
    parser.add_argument("--no-parity", action="store_true", help="skip the exact-gradient check")
    parser.add_argument("--plugin", action="append", help="module registering extra arms")


def run_options(args: argparse.Namespace, defaults: dict | None = None) -> dict:
    """Grid options: the command's `defaults`, then a suite (if any), then explicit
    command-line values, each overriding the one before."""
    from arms.registry import DEFAULT_ARMS
    from harness.grid import load_suite

    options = dict(defaults or {})
    options.update(load_suite(args.suite) if args.suite else {})
    explicit = {
        "arms": args.arms, "preset": args.preset, "seq": args.seq, "batch": args.batch,
        "ga": args.ga, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "dtype": DTYPES.get(args.dtype, args.dtype), "mesh": args.mesh, "loss": args.loss,
        "optimizer": args.optimizer, "ragged": args.ragged, "timeout_s": args.timeout,
        "cpu_devices": args.cpu_devices, "trace_steps": args.trace_steps,
        "scan_layers": args.scan_layers, "remat": args.remat,
    }
    options.update({k: v for k, v in explicit.items() if v is not None})
    if args.trace_hlo is not None:
        options["trace_hlo"] = args.trace_hlo
    if args.trace is not None:
        options["trace"] = args.trace
    elif args.trace_hlo or (options.get("trace_hlo") and "trace" not in options):
        options["trace"] = True  # asking for the HLO proto is asking for a trace
    if args.no_parity:
        options["parity"] = False
    options.setdefault("arms", list(DEFAULT_ARMS))
    return options


class Grid:
    """A grid command's validated cells, environment and options, and `run`: the one way
    run, nightly and ab run cells.

    Every bad value fails here, before anything runs: first what needs no device (value
    ranges, arms, presets, shapes, ragged counts, the mesh's syntax, plugins, the output
    directory, an existing results file), with no process started and nothing written; then,
    after one short probe process reports the devices, the mesh against them.
    """

    def __init__(self, args: argparse.Namespace, out: Path, processes: int = 1,
                 run_id: str | None = None, options: dict | None = None,
                 target: dict | None = None):
        """`options`: what `check_values` returned for these arguments (with the command's
        defaults), where the command already called it; else it is called here. `target`:
        plan every cell for this TPU topology instead of running it
        (harness.plan.target.describe), its meshes checked against its devices."""
        import dataclasses

        from harness import grid, results, runner

        if run_id is not None:
            runner.check_run_id(run_id)
        plugins = tuple(args.plugin or ())
        self.options = options or self.check_values(args, out, processes)
        self.run_id = run_id or runner.new_run_id()
        self.path = runner.results_path(out, self.run_id, self.options.get("name"))
        results.check_appendable(self.path)
        self.env, self.environment = runner.cell_environment(self.options.get("cpu_devices"),
                                                             planning=target is not None)
        available = {**self.environment,
                     "device_count": self.environment["device_count"] * processes}
        planned = {}
        if target is not None:
            available = {"target": target["target"], "device_count": target["device_count"]}
            planned = {"plan_target": target["target"], "plan_slices": target["slices"],
                       "plan_libtpu": target["libtpu"], "trace": False, "parity": False,
                       "plan_cache": target.get("plan_cache")}
        cells = grid.expand(self.options, mesh_sizes=available)
        # Absolute: cells may run elsewhere (an A/B worktree) and records outlive the cwd.
        trace_dir = str((out / "traces").absolute()) if self.options.get("trace") else None
        self.cells = [dataclasses.replace(c, trace_dir=trace_dir, plugins=plugins, **planned)
                      for c in cells]
        if target is not None and target.get("hlo_dir"):
            from harness.runner import trace_session

            self.cells = [dataclasses.replace(c, plan_hlo_dir=str(
                (Path(target["hlo_dir"]) / trace_session(self.run_id, c)).absolute()))
                for c in self.cells]
        self.out, self.timeout_s = out, self.options.get("timeout_s", 600)
        self.finished = 0
        where = (f"planned for {target['target']} ({target['device_count']} x "
                 f"{target['device_kind']}, compiled on this host)" if target else
                 f"on {self.environment['backend']} ({self.environment['device_count']} x "
                 f"{self.environment['device_kind']})")
        print(f"parity: {len(self.cells)} cells {where}, results -> {out}", flush=True)

    @staticmethod
    def check_values(args: argparse.Namespace, out: Path, processes: int = 1,
                     defaults: dict | None = None) -> dict:
        """The grid's options, every value checked that needs no device: no process is
        started and nothing is written (a probe file in `out` is created and removed)."""
        from harness import grid, results

        for module in args.plugin or ():
            _import_plugin(module)
        options = run_options(args, defaults)
        if processes > 1 and not options.get("mesh"):
            options["mesh"] = MULTI_PROCESS_MESH
        grid.check_run_options(options)
        grid.expand(options)
        results.check_writable(out)
        if options.get("trace"):
            results.check_writable(out / "traces", "--trace: the traces directory")
        return options

    @contextlib.contextmanager
    def progress(self, total: int):
        """(on_start, on_record) callbacks: a line when a cell starts (which of `total`) and
        its result line when it ends, on stdout whatever it is (a log, a pipe, CI), plus a
        progress bar on stderr when that is a terminal."""
        from tqdm import tqdm

        from harness import console

        bar = tqdm(total=total, unit="cell", file=sys.stderr, disable=not sys.stderr.isatty())
        started = 0
        finished: list = []  # the records so far: a cell's work is judged against them

        def on_start(cell, round_index):
            nonlocal started
            started += 1
            tqdm.write(console.start_line(cell.arm, cell.spec, round_index, started, total),
                       file=sys.stdout)
            sys.stdout.flush()

        def on_record(index, record):
            self.finished += 1
            bar.update(1)
            # Counted by ends: cells planned side by side end in another order than they start
            tqdm.write(f"[{self.finished}/{total}] {console.cell_line(record, finished)}",
                       file=sys.stdout)
            finished.append(record)
            sys.stdout.flush()

        try:
            yield on_start, on_record
        finally:
            bar.close()

    def kept(self, where: Path | None = None) -> str:
        """What a stopped run leaves: the finished cells' records, where they are."""
        if not self.finished:
            return "no cell had finished; no record was written"
        return f"the {self.finished} finished cells' records are kept in {where or self.path}"

    @property
    def rounds(self) -> int:
        return self.options.get("rounds", 1)

    def run(self, jobs: int = 1, **kwargs):
        """(results path, records) of every cell, `rounds` times, with progress lines; a
        resumed run (an existing --run-id) skips the cells its file holds already. `jobs`
        > 1 plans that many cells side by side (plans only: harness.pool), each process
        allowed to load libtpu beside the others."""
        from harness import runner

        env = self.env
        if jobs > 1:
            from harness.plan.target import MULTIPLE_LOAD_ENV

            env = {**env, MULTIPLE_LOAD_ENV: "1"}

        done = len(runner.recorded(self.path, self.run_id))
        if done:
            print(f"parity: resuming run {self.run_id}: {done} cells are recorded in "
                  f"{self.path} and are skipped", flush=True)
        with self.progress(len(self.cells) * self.rounds - done) as (on_start, on_record), \
                stopped_keeps(self.kept):
            return runner.run_grid(self.cells, self.out, env=env,
                                   timeout_s=self.timeout_s, suite=self.options.get("name"),
                                   rounds=self.rounds, on_start=on_start, on_record=on_record,
                                   environment=self.environment, run_id=self.run_id,
                                   jobs=jobs, **kwargs)

    def run_paired(self, slices: int):
        """(results path, records): each shape's arms in one process, `rounds` processes
        per shape, timed in `slices` alternating slices (harness.paired)."""
        from harness import paired

        paired.check([c.arm for c in paired.groups(self.cells)[0]],
                     self.options.get("steps", 10), slices)
        with self.progress(len(self.cells) * self.rounds) as (on_start, on_record), \
                stopped_keeps(self.kept):
            return paired.run_paired_grid(
                self.cells, self.out, env=self.env, timeout_s=self.timeout_s,
                slices=slices, rounds=self.rounds, suite=self.options.get("name"),
                environment=self.environment, run_id=self.run_id, on_start=on_start,
                on_record=on_record)


MULTI_PROCESS_MESH = "fsdp=-1"
"""The mesh of a multi-process run given none: FSDP over every process's devices (one
device, the single-process default, cannot hold a batch that several processes feed)."""


def _import_plugin(module: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError as err:
        raise ValueError(f"--plugin {module}: cannot import it ({err}); give a module on "
                         "PYTHONPATH that registers arms") from None


class Stopped(Exception):  # noqa: N818 - a stop, not a fault
    """The run was stopped by a signal; `code` is the exit status (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def stopped_keeps(kept: Callable[[], str]):
    """SIGINT, SIGTERM and SIGHUP end the block with one line saying what is `kept()`, then
    `Stopped`; the cell running is killed and its temp files removed on the way out."""
    import signal

    from harness.reaper import Terminated, terminate_on_signals

    try:
        with terminate_on_signals():
            yield
    except KeyboardInterrupt:
        print(f"\nparity: interrupted (SIGINT); {kept()}", file=sys.stderr)
        raise Stopped(128 + signal.SIGINT) from None
    except Terminated as stop:
        print(f"\nparity: stopped by {stop}; {kept()}", file=sys.stderr)
        raise Stopped(stop.exit_code) from None
