"""The `parity` command line: a thin layer over importable library functions.

One `Command` class per subcommand, each with its arguments (`setup`) next to its handler
(`run`). The choices it offers (arms, losses, optimizers, remat policies, suites) are read
from the modules that own them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from harness.cli_results import Compare, Publish, Report, Trace
from harness.command import Command, check_fraction
from harness.grid_run import Grid, Stopped, add_grid_arguments, stopped_keeps


class Selftest(Command):
    name = "selftest"
    help = "param counts, a ragged-batch loss/gradient and three-model logits parity"
    description = ("Prints a preset's parameter count, the loss and exact-gradient norm on a "
                   "ragged batch, and same-weights logits parity of our decoder, MaxText's "
                   "Qwen3 and Tunix's Qwen3 on `tiny`.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("--preset", default="tiny", help="model preset for the loss check")

    @classmethod
    def run(cls, args):
        from harness.selftest import selftest

        try:
            for line in selftest(args.preset):
                print(line, flush=True)
        except AssertionError as err:
            print(err, file=sys.stderr)
            return 1
        return 0


class Env(Command):
    name = "env"
    help = "print the environment records are compared by"
    description = ("Prints the environment cells would record (git sha, versions, backend, "
                   "devices, XLA flags, host allocator settings).")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("--cpu-devices", type=int, help="emulate N CPU devices")

    @classmethod
    def run(cls, args):
        import json

        from harness.runner import cell_environment

        print(json.dumps(cell_environment(args.cpu_devices)[1], indent=1))
        return 0

class Run(Command):
    name = "run"
    help = "run a grid of cells (one subprocess each) and store the records"
    description = ("Runs arm x preset x seq x batch x GA cells, each in its own process: "
                   "warmup, untraced timing, memory, optional trace, gradient parity.")

    @classmethod
    def setup(cls, parser):
        add_grid_arguments(parser)
        parser.add_argument("--out", type=Path, default=Path("results"),
                            help="results directory")
        parser.add_argument("--num-processes", type=int, help="processes of a multi-process run")
        parser.add_argument("--process-id", type=int, help="this process's index (0 writes)")
        parser.add_argument("--coordinator", help="HOST:PORT of process 0 (cell k uses PORT+k)")
        parser.add_argument("--distributed-auto", action="store_true",
                            help="let jax.distributed detect the cluster (e.g. Cloud TPU)")
        parser.add_argument("--run-id", help="name of the results file (default: a timestamp)")
        parser.add_argument("--strict-parity", action="store_true",
                            help="exit 1 when a cell fails gradient parity too (default: only "
                                 "when a cell fails to run)")
        parser.add_argument("--selftest", action="store_true",
                            help="run `parity selftest` first, while the arms' packages "
                                 "import; no cell starts unless it passes (exit 1)")
        parser.add_argument("--pairing", choices=["processes", "in-process"],
                            default="processes",
                            help="processes: every cell in processes of its own (--rounds "
                                 "of them, interleaved); in-process: the arms of a shape "
                                 "built in one process and timed in alternating slices, "
                                 "--rounds such processes (only arms that can share a "
                                 "process: engine, engine-fused, native)")
        parser.add_argument("--slices", type=int, default=8,
                            help="in-process pairing: slices the timed steps are cut into "
                                 "(A B C, B C A, C A B, ...; default 8)")

    @classmethod
    def run(cls, args):
        from harness import console
        from reports import viewers

        distributed = _distributed(args)
        if args.pairing == "in-process" and (distributed or args.selftest):
            raise ValueError("--pairing in-process runs on one host without --selftest; "
                             "drop --num-processes/--distributed-auto and --selftest")
        grid = Grid(args, args.out, processes=args.num_processes or 1, run_id=args.run_id)
        alongside = _selftest if args.selftest and not args.process_id else None
        if args.pairing == "in-process":
            path, records = grid.run_paired(args.slices)
        else:
            path, records = grid.run(distributed=distributed, alongside=alongside)
        parity_failed = [r for r in records if console.parity_failed(r)]
        code = 0 if all(r.ok for r in records) and not (
            args.strict_parity and parity_failed) else 1
        if args.process_id:
            return code
        print(console.table(records))
        hint = viewers.hint(records)
        if hint:
            print(f"\n{hint}")
        if parity_failed:
            print(f"\nparity: {len(parity_failed)} cells failed gradient parity (their times "
                  "are not comparable work)" + ("" if args.strict_parity else
                                                "; --strict-parity makes that exit 1"))
        print(f"\nrecords: {path}")
        return code


PLAN_CACHE = ".plan-cache"
"""The plan cache's directory inside a plan's --out (or nightly's --history)."""


class PlanCommand(Command):
    name = "plan"
    help = "XLA's plan of every arm for a TPU topology, compiled here (nothing runs)"
    description = ("Compiles each cell's step for a TPU topology's compile-only devices "
                   "(libtpu; no chip needed), from shapes alone, one process per cell, and "
                   "records XLA's plan: planned peak HBM per device against the capacity, "
                   "resident state, HBM and collective bytes and FLOPs per step. A plan is the "
                   "compiler's figure for the target, not a measurement. Exit 0 when every "
                   "cell planned and fits, 1 when one failed or does not fit (named), 2 on "
                   "bad input.")

    TIMEOUT_S = 1800
    """A cell's default limit: XLA:TPU compiles a split engine's three kernels of a qwen3-8b
    step in 10+ minutes on 2 cores (a run's default, 600 s, is for running cells)."""

    @classmethod
    def setup(cls, parser):
        from harness.plan.target import TPU7X

        add_grid_arguments(parser)
        parser.add_argument("--target", help=f"TPU topology (default: the suite's, else "
                                              f"{TPU7X}), e.g. v5e:2x2, v5p:2x2x1, v6e:2x2")
        parser.add_argument("--target-slices", type=int,
                            help="slices of the topology (default: the suite's, else 1)")
        parser.add_argument("--out", type=Path, default=Path("results/plan"),
                            help="results directory")
        parser.add_argument("--run-id", help="name of the results file (default: a timestamp)")
        parser.add_argument("--save-hlo", action="store_true",
                            help="write each executable's optimized TPU HLO text under "
                                 "OUT/hlo/<run id>/<cell>/ (to find what a figure comes from)")
        parser.add_argument("--jobs", type=int,
                            help="cells planned side by side (default: one per core, as many "
                                 "as host memory holds at 8 GiB each); a plan's figures do "
                                 "not depend on it, only its compile seconds")
        parser.add_argument("--no-plan-cache", action="store_true",
                            help="compile every executable (default: a program planned "
                                 "before for the same target and versions is read back from "
                                 "OUT/.plan-cache)")

    @classmethod
    def run(cls, args):
        from harness import console, results
        from harness.plan import target

        options = Grid.check_values(args, args.out, defaults={"trace": False,
                                                               "timeout_s": cls.TIMEOUT_S})
        if args.rounds not in (None, 1):
            raise ValueError(f"--rounds {args.rounds}: a plan is deterministic (the "
                             "same code and versions give the same figures); plan once")
        options["rounds"] = 1  # a suite's rounds are for timing
        if args.jobs is not None and args.jobs < 1:
            raise ValueError(f"--jobs {args.jobs}: give at least 1 cell at a time")
        name = args.target or options.get("target") or target.TPU7X
        slices = (args.target_slices if args.target_slices is not None
                  else options.get("target_slices", 1))
        if args.save_hlo:
            results.check_writable(args.out / "hlo", "--save-hlo: the HLO directory")
        described = target.probe(name, slices)
        if args.save_hlo:
            described["hlo_dir"] = str(args.out / "hlo")
        if not args.no_plan_cache:
            described["plan_cache"] = str((args.out / PLAN_CACHE).absolute())
        jobs = args.jobs if args.jobs is not None else target.default_jobs()
        grid = Grid(args, args.out, run_id=args.run_id, options=options, target=described)
        path, records = grid.run(jobs=jobs)
        print(console.plan_table(records))
        failing = [f"{console.cell_name(r.arm, r.spec)}: "
                   + (f"{r.error.reason}: {r.error.message[:300]}" if not r.ok else
                      f"planned peak {r.plan.planned_peak_bytes / 2**30:.2f} GiB > "
                      f"{r.plan.hbm_capacity_bytes / 2**30:.2f} GiB available")
                   for r in records if not r.ok or r.plan.fits is False]
        print(f"\nrecords: {path}")
        if failing:
            print(f"parity: {len(failing)} cells do not plan or do not fit on {name}:\n"
                  + "\n".join(f"  {f}" for f in failing), file=sys.stderr)
            return 1
        return 0


class SelftestError(Exception):
    """`parity run --selftest`: the selftest failed (it printed why); no cell ran."""


def _selftest() -> None:
    """`parity selftest` in a process of its own (its lines go to this one's stdout and
    stderr); raises SelftestError unless it passed."""
    import subprocess

    code = subprocess.run([sys.executable, "-m", "harness.cli", "selftest"]).returncode
    if code != 0:
        raise SelftestError(code)


def _distributed(args: argparse.Namespace) -> dict | None:
    if args.distributed_auto:
        return {"auto": True}
    if args.num_processes is None or args.num_processes == 1:
        return None
    if args.coordinator is None or args.process_id is None:
        raise ValueError("--num-processes needs --coordinator HOST:PORT and --process-id I "
                         "(or --distributed-auto where JAX detects the cluster)")
    if not 0 <= args.process_id < args.num_processes:
        raise ValueError(f"--process-id {args.process_id} is not in [0, {args.num_processes})")
    return {"coordinator": args.coordinator, "num_processes": args.num_processes,
            "process_id": args.process_id}


class Launch(Command):
    name = "launch"
    help = "start N local processes of one multi-process `parity run`"
    description = ("parity launch -n 2 -- --arms engine --preset tiny --cpu-devices 4 ...: "
                   "runs `parity run` N times on this machine as one jax.distributed job.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("-n", type=int, required=True, help="number of processes")
        parser.add_argument("run_args", nargs=argparse.REMAINDER, help="arguments of `run`")

    @classmethod
    def run(cls, args):
        import socket
        import subprocess
        import tempfile

        from harness.reaper import REAPER, Terminated, die_with_parent, terminate_on_signals

        if args.n < 1:
            raise ValueError(f"launch -n {args.n}: give at least 1 process")
        rest = [a for a in args.run_args if a != "--"]
        run_args = build_parser(only="run").parse_args(["run", *rest])
        Grid.check_values(run_args, run_args.out, processes=args.n)  # once, not N times
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with tempfile.TemporaryDirectory(prefix="parity-launch-") as tmp, \
                REAPER.watch("path", path=tmp):  # removed even if this process is killed
            logs = [None] + [open(Path(tmp) / f"{i}.err", "w+") for i in range(1, args.n)]  # noqa: SIM115
            procs = [subprocess.Popen(
                [sys.executable, "-m", "harness.cli", "run", *rest, "--num-processes",
                 str(args.n), "--process-id", str(i), "--coordinator", f"127.0.0.1:{port}",
                 "--run-id", f"launch-{port}"],
                stdout=None if i == 0 else subprocess.DEVNULL, stderr=logs[i],
                preexec_fn=die_with_parent(os.getpid())) for i in range(args.n)]
            try:
                with terminate_on_signals():
                    codes = [p.wait() for p in procs]
            except (KeyboardInterrupt, Terminated) as stop:
                for p in procs:  # each one cleans up after itself on SIGTERM
                    p.terminate()
                for p in procs:
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
                raise Stopped(getattr(stop, "exit_code", 130)) from None
            if codes[0] == 0:  # process 0 reports its own failure; the others', once
                for i, code in enumerate(codes[1:], 1):
                    if code:
                        logs[i].seek(0)
                        tail = logs[i].read().strip().splitlines()[-1:] or ["(no output)"]
                        print(f"parity: process {i} exited {code}: {tail[0]}",
                              file=sys.stderr)
            for log in logs[1:]:
                log.close()
        return codes[0] if codes[0] else max(codes)


class Nightly(Command):
    name = "nightly"
    help = "run a suite, append to the history, exit 1 on a regression"
    description = ("Runs the grid, appends its records to HISTORY and compares each cell "
                   "with the comparable history (exit 0 ok, 1 regression, 2 broken run).")

    @classmethod
    def setup(cls, parser):
        add_grid_arguments(parser)
        parser.add_argument("--history", type=Path, required=True, help="history directory")
        parser.add_argument("--threshold", type=float,
                            help="relative slowdown that counts (default: suite's, else 0.05)")
        parser.add_argument("--report", type=Path, help="where nightly.md and plots go")
        parser.add_argument("--plan", action="store_true",
                            help="also plan every cell for the suite's target (or --target) "
                                 "and compare the plans with the history's, exactly")
        parser.add_argument("--target", help="TPU topology of --plan (default: the suite's, "
                                             "else tpu7x:2x2x1)")
        parser.add_argument("--publish", type=Path, metavar="SITE",
                            help="then republish the history's static site to SITE (as "
                                 "`parity publish HISTORY -o SITE`)")

    ROUNDS = 4
    """Default rounds a night: 4 new runs against 4+ history runs is the smallest unpaired
    sample whose CI can reach 95% (reports.stats.luck_bound)."""

    @classmethod
    def run(cls, args):
        from harness import nightly, results
        from reports import site

        results.check_writable(args.history, "--history")  # the runs are written there
        if args.publish is not None:
            site.check_output(args.publish, "--publish")
        if args.history.is_dir() and any(args.history.glob("*.jsonl")):
            results.read_dir(args.history)  # a corrupt history fails now, not after the grid
        report_dir = args.report or args.history / "nightly"
        results.check_writable(report_dir, "--report")
        options = Grid.check_values(args, args.history, defaults={"rounds": cls.ROUNDS})
        threshold = args.threshold or options.get("regression_threshold", 0.05)
        if not threshold > 0:
            raise ValueError(f"--threshold {threshold}: give a relative slowdown > 0")
        described = None
        if args.plan:  # a target libtpu cannot plan fails before the grid runs
            from harness.plan import target

            described = target.probe(args.target or options.get("target") or target.TPU7X,
                                     options.get("target_slices") or 1)
            described["plan_cache"] = str((args.history / PLAN_CACHE).absolute())
        grid = Grid(args, args.history, options=options)
        _, records = grid.run()
        if described is not None:
            plans = Grid(args, args.history, options={**options, "rounds": 1, "trace": False},
                         target=described)
            records = [*records, *plans.run(jobs=target.default_jobs())[1]]
        code, text = nightly.evaluate(records, args.history, threshold=threshold,
                                      report_dir=report_dir, publish_to=args.publish)
        print(text)
        return code


class AB(Command):
    name = "ab"
    help = "A/B two git refs: the same cells, interleaved round by round"
    description = ("Checks out REF_A and REF_B as git worktrees and runs every cell from "
                   "each, A's and B's processes one after the other (or side by side in "
                   "lockstep), for --rounds rounds; reports the ratio of "
                   "medians with a 95%% CI, a verdict, the minimum detectable effect and any "
                   "change in the exact cost metrics. Exit 1 when B is slower beyond noise or "
                   "costs more (unless --no-fail), 2 on bad input. `parity ab HEAD HEAD` "
                   "measures the noise floor.")
    ROUNDS = 16
    STEPS = 10
    """Defaults: 16 rounds of 10 steps, processes one after the other. On a 2-core CPU
    VM the noise is set by how far a whole process's median moves from the next process's
    (6-15%), against a 1-3% standard error of one process's median over 10 steps, so rounds
    buy far more than steps. Measured there (`ab HEAD HEAD --arms native --preset small`):
    processes one after the other, MDE 9.4-14.8% and 254-446 s; in lockstep, MDE 6.1-7.5%
    and 159-171 s (both processes build at once; `--pairing lockstep`). A planted 5%
    slowdown read 1.038 [1.004, 1.094] in lockstep and 1.049 [0.988, 1.114] one after the
    other. 6 rounds, the fewest that can reach 95% by the CI alone (reports.stats.MIN_PAIRS),
    cost less and detect less; pass --rounds to trade sensitivity for time."""

    @classmethod
    def setup(cls, parser):
        parser.add_argument("ref_a")
        parser.add_argument("ref_b")
        add_grid_arguments(parser)
        parser.add_argument("--threshold", type=float, default=0.05,
                            help="smallest relative difference that earns a verdict (0.05)")
        parser.add_argument("--allow-dirty", action="store_true",
                            help="allow uncommitted changes (HEAD is measured as committed)")
        parser.add_argument("--no-fail", action="store_true",
                            help="exit 0 even when B is slower or costs more")
        parser.add_argument("--out", type=Path, default=Path("results/ab"), help="results dir")
        parser.add_argument("--pairing", choices=["processes", "lockstep"],
                            default="processes",
                            help="processes (default): A's and B's process of a round one "
                                 "after the other; lockstep: side by side, their steps "
                                 "alternating in --slices slices (both refs need lockstep's "
                                 "worker)")
        parser.add_argument("--slices", type=int, default=5,
                            help="lockstep: slices the timed steps are cut into (default 5)")

    @classmethod
    def run(cls, args):
        from harness import ab
        from reports.stats import MIN_PAIRS

        check_fraction(args.threshold)
        options = Grid.check_values(args, args.out, defaults={
            "rounds": cls.ROUNDS, "steps": cls.STEPS, "trace": False})
        if options["rounds"] < MIN_PAIRS:
            raise ValueError(f"--rounds {options['rounds']}: A/B needs at least "
                             f"{MIN_PAIRS} rounds (fewer interleaved pairs "
                             "cannot reach 95% confidence)")
        ab.check_repo()  # git's answers: the first processes started
        ab.resolve_ref(args.ref_a)
        ab.resolve_ref(args.ref_b)
        ab.check_clean([args.ref_a, args.ref_b], allow_dirty=args.allow_dirty)
        lockstep = 0 if args.pairing == "processes" else args.slices
        if lockstep and (lockstep < 2 or options["steps"] % lockstep):
            raise ValueError(f"--slices {lockstep} with --steps {options['steps']}: give 2 or "
                             "more slices that divide the timed steps (e.g. --steps 10 "
                             "--slices 5), or pass --pairing processes")
        grid = Grid(args, args.out, options=options)
        with grid.progress(len(grid.cells) * 2 * grid.rounds) as (on_start, on_record), \
                stopped_keeps(lambda: grid.kept(args.out) + "; worktrees removed"):
            result = ab.run_ab(args.ref_a, args.ref_b, grid.cells, args.out, env=grid.env,
                               timeout_s=grid.timeout_s, rounds=grid.rounds,
                               on_start=on_start, on_record=on_record,
                               min_effect=args.threshold, lockstep_slices=lockstep)
        text = ab.markdown(args.ref_a, args.ref_b, result, grid.rounds, args.threshold)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "ab.md").write_text(text)
        print(text)
        return 1 if result.slower and not args.no_fail else 0


COMMANDS: tuple[type[Command], ...] = (Selftest, Env, Run, PlanCommand, Launch, Nightly, AB,
                                        Compare, Report, Publish, Trace)


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'parity run: error: ... (see parity run --help)'."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or with `only`, the full arguments of that one alone:
    the grid commands' choices come from modules that import JAX (~1.5 s), which `compare`,
    `report` and `--help` have no use for."""
    parser = Parser(
        prog="parity", description="Performance-parity harness for JAX LLM training engines.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help,
                                  description=command.description)
        if only is None or only == command.name:
            command.setup(sub)
        sub.set_defaults(func=command.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except (KeyboardInterrupt, ImportError) as err:  # before any cell ran: nothing to keep
        # A Ctrl-C while a C extension initializes (jaxlib's) arrives as an ImportError
        # raised from the KeyboardInterrupt; any other ImportError is a real one.
        if isinstance(err, ImportError) and not isinstance(err.__cause__, KeyboardInterrupt):
            raise
        print("\nparity: interrupted (SIGINT)", file=sys.stderr)
        return 130


def _main(argv: list[str]) -> int:
    from harness.results import WriteError

    # The top-level parser has no options of its own: its first positional is the command.
    command = next((arg for arg in argv if not arg.startswith("-")), "")
    try:
        args = build_parser(only=command).parse_args(argv)
        return args.func(args)
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"parity: error: {err}", file=sys.stderr)
        return 2
    except WriteError as err:  # e.g. a full disk: what was kept, what was lost
        print(f"parity: error: {err}", file=sys.stderr)
        return 2
    except Stopped as stop:  # the line saying what is kept is already printed
        return stop.code
    except SelftestError:  # what failed is printed above
        print("parity: error: the selftest failed (above); no cell was run, nothing "
              "written", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
