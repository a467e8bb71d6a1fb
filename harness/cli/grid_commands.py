"""The subcommands that run cells: `run`, `plan`, `launch`, `nightly` and `ab`. Each parses
its arguments, calls its library function (harness.jobs) and prints."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from harness.cli.command import Command, Parser, check_fraction
from harness.cli.grid_args import add_grid_arguments, request
from harness.cli.watch import Progress, Stopped, stopped_keeps
from harness.contract import IN_PROCESS, LOCKSTEP, PROCESSES


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


def check(request, **options) -> dict:
    """harness.jobs.grid.check, imported when a command runs (it imports JAX)."""
    from harness.jobs.grid import check as check_grid

    return check_grid(request, **options)


def add_dirty_argument(parser: argparse.ArgumentParser) -> None:
    """`--allow-dirty` of the commands that record the checkout's own code (run, plan,
    nightly): harness.jobs.grid.check_code."""
    parser.add_argument("--allow-dirty", action="store_true",
                        help="run from a checkout whose files are not its HEAD commit's "
                             "(uncommitted or untracked changes): the records say so and "
                             "name the tree of the files (default: refused, since no record "
                             "could name the commit that ran; PARITY_ALLOW_DIRTY=1 likewise)")


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
        _time_limit_argument(parser)
        parser.add_argument("--strict-parity", action="store_true",
                            help="exit 1 when a cell fails gradient parity too (default: only "
                                 "when a cell fails to run)")
        parser.add_argument("--selftest", action="store_true",
                            help="run `parity selftest` first, while the arms' packages "
                                 "import; no cell starts unless it passes (exit 1)")
        parser.add_argument("--pairing", choices=[PROCESSES, IN_PROCESS], default=PROCESSES,
                            help="processes: every cell in processes of its own (--rounds "
                                 "of them, interleaved); in-process: the arms of a shape "
                                 "built in one process and timed in alternating slices, "
                                 "--rounds such processes (only arms that can share a "
                                 "process: engine, engine-fused, native)")
        parser.add_argument("--slices", type=int, default=8,
                            help="in-process pairing: slices the timed steps are cut into "
                                 "(A B C, B C A, C A B, ...; default 8)")
        add_dirty_argument(parser)

    @classmethod
    def run(cls, args):
        from harness.cli import console
        from harness.jobs import run as run_job
        from harness.jobs.deadline import CUT
        from reports import viewers

        deadline = _deadline(args)
        distributed = _distributed(args)
        wanted = request(args, args.out)
        options = check(wanted, processes=args.num_processes or 1,
                        allow_dirty=args.allow_dirty)
        path, records = run_job.run(
            wanted, options, processes=args.num_processes or 1, run_id=args.run_id,
            distributed=distributed, pairing=args.pairing, slices=args.slices,
            alongside=_selftest if args.selftest and not args.process_id else None,
            deadline=deadline, watch=Progress())
        parity_failed = [r for r in records if console.parity_failed(r)]
        code = 0 if all(r.ok or r.unavailable for r in records) and not (
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
        if deadline is not None and deadline.cut:
            print(deadline.summary())
            return code or CUT
        return code


def _time_limit_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time-limit", type=float, metavar="SECONDS",
                        help="start no cell expected (by the longest earlier record of its "
                             "arm and shape, else arm, in the results directory) to end past "
                             "SECONDS from the command's start: a host's limit stops the "
                             "run between cells; exit 3, and the same command with the "
                             "same --run-id runs the rest")


def _deadline(args):
    """The Deadline of --time-limit, counted from now; None without one."""
    from harness.jobs.deadline import Deadline

    return None if args.time_limit is None else Deadline(args.time_limit)


class Plan(Command):
    name = "plan"
    help = "XLA's plan of every arm for a TPU topology, compiled here (nothing runs)"
    description = ("Compiles each cell's step for a TPU topology's compile-only devices "
                   "(libtpu; no chip needed), from shapes alone, one process per cell, and "
                   "records XLA's plan: planned peak HBM per device against the capacity, "
                   "resident state, HBM and collective bytes and FLOPs per step. A plan is the "
                   "compiler's figure for the target, not a measurement. Exit 0 when every "
                   "cell planned and fits, 1 when one failed or does not fit (named), 2 on "
                   "bad input.")

    @classmethod
    def setup(cls, parser):
        from harness.xla.target import TPU7X

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
                            help="cells planned side by side (default: one per 2 cores, as "
                                 "many as host memory holds at 8 GiB each: one compile keeps "
                                 "~2 cores busy); a plan's figures do not depend on it, only "
                                 "its compile seconds")
        parser.add_argument("--no-plan-cache", action="store_true",
                            help="compile every executable (default: a program planned "
                                 "before for the same target and versions is read back from "
                                 "OUT/.plan-cache)")
        add_dirty_argument(parser)

    @classmethod
    def run(cls, args):
        from harness.cli import console
        from harness.jobs import plan as plan_job

        wanted = request(args, args.out)
        options = plan_job.check(wanted, jobs=args.jobs, save_hlo=args.save_hlo,
                                 allow_dirty=args.allow_dirty)
        target = plan_job.describe_target(options, args.out, name=args.target,
                                 slices=args.target_slices, save_hlo=args.save_hlo,
                                 cache=not args.no_plan_cache)
        path, records = plan_job.plan(wanted, options, target, run_id=args.run_id,
                                      jobs=args.jobs, watch=Progress())
        print(console.plan_table(records))
        print(f"\n{console.ROOFLINE_NOTE}")
        failing = plan_job.failing(records)
        print(f"\nrecords: {path}")
        if failing:
            print(f"parity: {len(failing)} cells do not plan or do not fit on "
                  f"{target['target']}:\n" + "\n".join(f"  {f}" for f in failing),
                  file=sys.stderr)
            return 1
        return 0


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
        from harness.jobs.launch import LaunchStopped, launch

        if args.n < 1:
            raise ValueError(f"launch -n {args.n}: give at least 1 process")
        rest = [a for a in args.run_args if a != "--"]
        run_parser = Parser(prog="parity run")
        Run.setup(run_parser)
        run_args = run_parser.parse_args(rest)
        check(request(run_args, run_args.out), processes=args.n,  # once, not N times
              allow_dirty=run_args.allow_dirty)
        try:
            code, said = launch(args.n, rest)
        except LaunchStopped as stop:
            raise Stopped(stop.code) from None
        for line in said:
            print(f"parity: {line}", file=sys.stderr)
        return code


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
                            help="relative slowdown that counts (default: the suite's "
                                 "regression_threshold, else the backend's minimum effect: "
                                 "1%% where every run is on a TPU, else 5%%)")
        parser.add_argument("--report", type=Path, help="where nightly.md and plots go")
        parser.add_argument("--plan", action="store_true",
                            help="also plan every cell for the suite's target (or --target) "
                                 "and compare the plans with the history's, exactly")
        parser.add_argument("--target", help="TPU topology of --plan (default: the suite's, "
                                             "else tpu7x:2x2x1)")
        parser.add_argument("--publish", type=Path, metavar="SITE",
                            help="then republish the history's static site to SITE (as "
                                 "`parity publish HISTORY -o SITE`)")
        parser.add_argument("--run-id",
                            help="name of the night's results file (default: a timestamp); "
                                 "the id of a night cut short (a time limit, a signal) "
                                 "resumes it: only the cells it has not recorded run, then "
                                 "the whole night is judged")
        _time_limit_argument(parser)
        add_dirty_argument(parser)

    @classmethod
    def run(cls, args):
        from harness.jobs import nightly
        from harness.jobs import plan as plan_job

        deadline = _deadline(args)
        wanted = request(args, args.history)
        options, threshold, report_dir = nightly.prepare(
            wanted, threshold=args.threshold, report=args.report, publish_to=args.publish,
            allow_dirty=args.allow_dirty)
        # A target libtpu cannot plan fails before the grid runs.
        target = plan_job.describe_target(options, args.history, name=args.target) if args.plan \
            else None
        code, text = nightly.nightly(wanted, options, threshold=threshold,
                                     report_dir=report_dir, target=target,
                                     publish_to=args.publish, run_id=args.run_id,
                                     deadline=deadline, watch=Progress())
        print(text)
        return code


def _ab_arguments(parser: argparse.ArgumentParser, out: str) -> None:
    """The options `ab` and `bisect` share (besides the grid's)."""
    add_grid_arguments(parser)
    parser.add_argument("--threshold", type=float,
                        help="minimum effect: the smallest relative difference called slower "
                             "or faster (default: the backend's, 1%% where every run is on a "
                             "TPU, else 5%%; docs/numbers.md)")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="allow uncommitted changes (HEAD is measured as committed)")
    parser.add_argument("--out", type=Path, default=Path(out), help="results dir")
    parser.add_argument("--pairing", choices=[LOCKSTEP, PROCESSES],
                        help="lockstep (the default on CPU): A's and B's processes of a "
                             "round side by side, their steps alternating in --slices "
                             "slices (both refs need a worker that speaks lockstep); "
                             "processes (the default on an accelerator, where one process "
                             "at a time holds the chip): one after the other")
    parser.add_argument("--slices", type=int,
                        help="lockstep: slices the timed steps are cut into (default 5)")
    parser.add_argument("--fixed-rounds", action="store_true",
                        help="run every one of --rounds rounds and judge once, at 95%%; by "
                             "default a cell stops as soon as its verdict at the minimum "
                             "effect cannot change (a sequential rule: each look's CI at a "
                             "confidence raised for its share of the 5%%; docs/numbers.md), "
                             "and --rounds is the most it runs")


def _ab_extra(args: argparse.Namespace) -> list[str]:
    """The A/B options given, as a command line repeats them."""
    found = []
    for flag, value in (("--threshold", args.threshold), ("--pairing", args.pairing),
                        ("--slices", args.slices)):
        if value is not None:
            found += [flag, str(value)]
    return found + (["--fixed-rounds"] if args.fixed_rounds else [])


def _stack(python: str | None, site: str | None):
    from harness.orchestrator.refs import Stack

    return Stack(python=python, site=site)


class AB(Command):
    name = "ab"
    help = "A/B two git refs (or two software stacks): the same cells, interleaved"
    description = ("Checks out REF_A and REF_B as git worktrees and runs every cell from "
                   "each, A's and B's processes side by side in lockstep (or one after the "
                   "other), for up to --rounds rounds (a cell stops once its verdict is "
                   "settled; --fixed-rounds: all), each side in this Python environment or in "
                   "its own (--python-a/-b, --site-a/-b: a jax, flax, optax or libtpu "
                   "upgrade gated like a commit); reports the ratio of medians with a 95%% "
                   "CI, a verdict, the minimum detectable effect and any change in the exact "
                   "cost metrics. Exit 1 when B is slower beyond noise or costs more (unless "
                   "--no-fail), 2 on bad input. `parity ab HEAD HEAD` measures the noise "
                   "floor.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("ref_a")
        parser.add_argument("ref_b")
        _ab_arguments(parser, "results/ab")
        parser.add_argument("--no-fail", action="store_true",
                            help="exit 0 even when B is slower or costs more")
        for side in "ab":
            parser.add_argument(f"--set-{side}", metavar="OPTION=VALUE", action="append",
                                help=f"side {side.upper()}'s cells with this option of our "
                                     "decoder (attention, attention_block_q, "
                                     "attention_block_kv, logits_chunk, scan_backward; "
                                     "repeatable): an A/B of a decoder option, e.g. "
                                     "`parity ab HEAD HEAD "
                                     "--set-a attention=xla` against the grid's")
            parser.add_argument(f"--python-{side}", metavar="PYTHON",
                                help=f"side {side.upper()}'s cells run in this Python "
                                     "interpreter (its own site-packages), e.g. another "
                                     "venv's bin/python")
            parser.add_argument(f"--site-{side}", metavar="DIR",
                                help=f"side {side.upper()}'s cells import the packages in DIR "
                                     "first (pip install --target DIR jax==... flax==...)")

    @classmethod
    def run(cls, args):
        from harness.jobs import ab
        from harness.store.layout import OutDir

        wanted, options = _ab_request(args)
        stacks = {"A": _stack(args.python_a, args.site_a),
                  "B": _stack(args.python_b, args.site_b)}
        result = ab.ab(args.ref_a, args.ref_b, wanted, options, pairing=args.pairing,
                       slices=args.slices or ab.SLICES, allow_dirty=args.allow_dirty,
                       min_effect=args.threshold, early=not args.fixed_rounds,
                       stacks={side: stack for side, stack in stacks.items() if stack},
                       sets={"A": _decoder_sets(args.set_a, "a"),
                             "B": _decoder_sets(args.set_b, "b")},
                       watch=Progress(kept_in=args.out, also_kept="worktrees removed"))
        text = ab.markdown(args.ref_a, args.ref_b, result, options["rounds"])
        out = OutDir(args.out)
        out.root.mkdir(parents=True, exist_ok=True)
        out.ab_markdown.write_text(text)
        print(text)
        return 1 if result.slower and not args.no_fail else 0


def _decoder_sets(given: list[str] | None, side: str) -> dict:
    """--set-a/-b OPTION=VALUE ... as {option: value}, a value of a whole-number CellSpec
    field as a number (ValueError naming the flag for a malformed one; which options a
    side may set, harness.jobs.ab.side_cells says)."""
    from arms.spec import CellSpec

    found = {}
    for item in given or []:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise ValueError(f"--set-{side} {item!r}: give OPTION=VALUE, e.g. attention=xla")
        field = CellSpec.__dataclass_fields__.get(key)
        try:
            found[key] = int(value) if field and isinstance(field.default, int) else value
        except ValueError:
            raise ValueError(f"--set-{side} {item!r}: {key} takes a whole number") from None
    return found


def _ab_request(args) -> tuple:
    """(request, checked options) of an A/B's arguments (ab, bisect): its threshold a
    fraction, its rounds and steps A/B's defaults unless given, untraced."""
    from harness.jobs import ab

    if args.threshold is not None:
        check_fraction(args.threshold)
    wanted = request(args, args.out)
    # Each side runs a committed ref in a worktree of its own: the checkout's own files never
    # run, and a HEAD with uncommitted changes is refused by ab's own check (check_clean).
    return wanted, check(wanted, defaults={"rounds": ab.ROUNDS, "steps": ab.STEPS,
                                           "trace": False}, allow_dirty=True)


class Bisect(Command):
    name = "bisect"
    help = "find the first commit after GOOD whose cell is slower than GOOD's"
    description = ("A binary search over BAD's first-parent history after GOOD: each step an "
                   "A/B (as `parity ab`: worktrees and compile caches kept across steps) of "
                   "one commit against GOOD at the one cell given, until the first commit "
                   "slower beyond noise by at least the minimum effect is found; then what "
                   "differs between it and its parent, and the `parity ab` line that "
                   "reproduces it. Exit 0 when a commit is named, 1 when BAD is not slower "
                   "(or a step's cell failed), 2 on bad input.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("good", help="a commit whose cell is not slower")
        parser.add_argument("bad", help="a later commit whose cell is slower")
        _ab_arguments(parser, "results/bisect")
        parser.add_argument("--python", metavar="PYTHON",
                            help="every step's cells run in this Python interpreter")
        parser.add_argument("--site", metavar="DIR",
                            help="every step's cells import the packages in DIR first")

    @classmethod
    def run(cls, args):
        from harness.jobs import ab
        from harness.jobs import bisect as bisect_job
        from harness.store.layout import OutDir

        wanted, options = _ab_request(args)
        stack = _stack(args.python, args.site)
        extra = _ab_extra(args) + [arg for side in "ab" for flag, value in (
            (f"--python-{side}", args.python), (f"--site-{side}", args.site))
            if value for arg in (flag, value)]

        def on_step(step, most):
            print(f"parity bisect: step {step.number} (of at most {most}): {step.line()}",
                  flush=True)

        progress = Progress(kept_in=args.out, also_kept="worktrees removed")
        with stopped_keeps(progress.kept):
            found = bisect_job.bisect(
                args.good, args.bad, wanted, options, pairing=args.pairing,
                slices=args.slices or ab.SLICES, allow_dirty=args.allow_dirty,
                min_effect=args.threshold, stack=stack or None, watch=progress,
                on_step=on_step, early=not args.fixed_rounds)
        text = bisect_job.markdown(args.good, args.bad, found, wanted, extra)
        out = OutDir(args.out)
        out.root.mkdir(parents=True, exist_ok=True)
        out.bisect_markdown.write_text(text)
        print(text)
        return 0 if found.first is not None else 1
