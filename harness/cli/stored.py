"""The subcommands that run no cell: `compare`, `explain`, `report`, `publish` and `trace`
read what runs stored (results files, profiler captures); `selftest` checks the models and `env`
prints the environment records are compared by."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.cli.command import Command, check_fraction
from harness.cli.watch import stoppable


class Compare(Command):
    name = "compare"
    help = "compare two saved result sets cell by cell"
    description = ("For every cell in both OLD and NEW (results files or directories): the "
                   "ratio of medians NEW/OLD with its 95%% CI and verdict, and every change "
                   "in the exact cost metrics. Exit 0, or 1 with --fail-on-regression when a "
                   "cell is slower beyond noise, failed, or costs more; 2 on bad input.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("old", type=Path, help="results directory or .jsonl file")
        parser.add_argument("new", type=Path, help="results directory or .jsonl file")
        parser.add_argument("--json", action="store_true", help="print JSON, not markdown")
        parser.add_argument("--threshold", type=float,
                            help="minimum effect: the smallest relative timing difference "
                                 "called slower or faster (default: the backend's, 1%% where "
                                 "every run is on a TPU, else 5%%; docs/numbers.md)")
        parser.add_argument("--cost-threshold", type=float, default=0.0,
                            help="relative cost increase that fails (default 0: any)")
        parser.add_argument("--fail-on-regression", action="store_true",
                            help="exit 1 on a timing regression, a failed cell or a cost "
                                 "increase")

    @classmethod
    def run(cls, args):
        import json

        from reports import compare
        from reports.record import read_dir

        if args.threshold is not None:
            check_fraction(args.threshold)
        if not 0 <= args.cost_threshold < float("inf"):
            raise ValueError(f"--cost-threshold {args.cost_threshold}: give a fraction >= 0, "
                             "e.g. 0 (any increase) or 0.01")
        old, new = read_dir(args.old), read_dir(args.new)
        rows = compare.compare_sets(old, new, min_effect=args.threshold)
        if args.json:
            print(json.dumps(compare.to_json(rows), indent=1))
        else:
            print(compare.markdown(rows, old_label=str(args.old), new_label=str(args.new)))
        failing = compare.regressions(rows, cost_threshold=args.cost_threshold)
        if failing and not args.json:
            from harness.jobs.explain import what_changed

            print("\n" + what_changed(rows, cost_threshold=args.cost_threshold))
        if args.fail_on_regression and failing:
            print("parity: regression:\n" + "\n".join(f"  {f}" for f in failing),
                  file=sys.stderr)
            return 1
        return 0


class Explain(Command):
    name = "explain"
    help = "say by operation why two plans, or two traces, of one cell differ"
    description = ("A and B: results (files or directories) each holding one plan record of "
                   "the cell planned with --save-hlo, or one record run with --trace, or two "
                   "captures (.xplane.pb, or a logdir above one); --arm picks a record where "
                   "the results hold several. Plans: per operation category (matmuls, fusions "
                   "by kind, copies and relayouts, dynamic-update-slices, collectives by kind, "
                   "custom calls, host transfers), per device and step, runs, FLOPs, HBM bytes "
                   "and collective bytes of each side and the change. Traces: per device, the "
                   "step split into compute, collectives, copies and idle, and device time per "
                   "step by category and by op, each change marked beyond noise or not. The "
                   "largest movers first, and what ran on one side only: what differs, not "
                   "why. A cause is named only where the two records differ in one "
                   "intervention (a commit, a software stack, an arm, an option) and their "
                   "timings say it moved the time. Exit 0, 2 on bad input.")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("a", type=Path, help="results or capture (side A)")
        parser.add_argument("b", type=Path, help="results or capture (side B)")
        parser.add_argument("--arm", help="the arm whose record to explain, where the results "
                                          "hold several")
        parser.add_argument("--trace", action="store_true",
                            help="explain the traced windows, where results hold plans too")
        parser.add_argument("--top", type=int, default=None,
                            help="show only the N largest movers")
        parser.add_argument("--json", action="store_true", help="print JSON, not markdown")

    @classmethod
    def run(cls, args):
        import json

        from harness.jobs import explain
        from harness.measure import trace_diff
        from reports.cause import DIFFERS

        if args.top is not None and args.top < 1:
            raise ValueError(f"--top {args.top}: give at least 1")
        sides = [(path, explain.records_at(path)) for path in (args.a, args.b)]
        if args.trace or {explain.which(records, args.arm) for _, records in sides} == {
                explain.TRACE}:
            found = explain.explain_traces(sides, args.arm)
            said = explain.cause_line([(records, explain.traced_record(records, args.arm))
                                       for _, records in sides])
            print(json.dumps({**trace_diff.to_json(found, args.top), "cause": said}, indent=1)
                  if args.json else
                  f"{DIFFERS}\n\n{trace_diff.markdown(found, args.top)}\n{said}")
            return 0
        a, b = (explain.pick(records, str(path), args.arm) for path, records in sides)
        found = explain.explain(a, b)
        said = explain.cause_line([(sides[0][1], a), (sides[1][1], b)])
        print(json.dumps({**explain.to_json(found, args.top), "cause": said}, indent=1)
              if args.json else f"{DIFFERS}\n\n{explain.markdown(found, args.top)}\n{said}")
        return 0


class Report(Command):
    name = "report"
    help = "write the markdown parity document and plots from results"
    description = ("Reads every *.jsonl record under RESULTS and writes a markdown document: a "
                   "summary first, then the detailed tables folded, with PNG plots beside it "
                   "(relative links) or embedded (--embed-images).")

    @classmethod
    def setup(cls, parser):
        from reports import baseline

        parser.add_argument("results", type=Path, help="results directory or .jsonl file")
        parser.add_argument("-o", "--output", type=Path, default=Path("parity.md"))
        parser.add_argument("--baseline-arm", default=None,
                            help="arm the speedup and memory ratios are taken against "
                                 f"(default: {baseline.describe()})")
        parser.add_argument("--embed-images", action="store_true",
                            help="write the plots into the markdown as data:image/png;base64 "
                                 "URIs, so a pasted document keeps them (default: PNG files "
                                 "beside it, linked relative to it)")
        parser.add_argument("--baseline", type=Path, metavar="RESULTS",
                            help="earlier results to compare with (as `parity compare "
                                 "BASELINE RESULTS`): a section at the end, with a folded "
                                 "'What differs' block under every regressed cell")

    @classmethod
    def _against(cls, old, new, label: str):
        from harness.jobs.explain import changes
        from reports import compare
        from reports.document import Against

        rows = compare.compare_sets(old, new)
        return Against(label=label, comparison=compare.markdown(
            rows, old_label="baseline", new_label="these"), changed=changes(rows))

    @classmethod
    def run(cls, args):
        from harness.store import results
        from reports.document import render
        from reports.record import read_dir

        new = read_dir(args.results)  # bad results fail before anything is written
        against = (cls._against(read_dir(args.baseline), new, str(args.baseline))
                   if args.baseline else None)
        results.check_writable(args.output.parent, "-o")
        if args.output.is_dir():
            raise ValueError(f"-o {args.output} is a directory; give the .md file to write")
        # Staged, then moved into place whole (reports.document): a stop writes nothing.
        stoppable(lambda: render(args.results, args.output, baseline_arm=args.baseline_arm,
                                  embed_images=args.embed_images, against=against),
                  "no report was written")
        print(f"report: {args.output}")
        return 0


class Publish(Command):
    name = "publish"
    help = "write the nightly history as a static site: index, a page per cell and shape"
    description = ("Reads every record under HISTORY and writes a static site to SITE "
                   "(opens from file://, no network): index.html, one row per cell with its "
                   "latest median and CI, a sparkline, the last verdict and cost change; a "
                   "page per cell (median per run with its CI band, regressions, cost and "
                   "plan step lines, environment changes, the latest run's step times, "
                   "traces); a page per shape with its arms side by side. Verdicts are the "
                   "nightly's. Exit 0, or 2 on bad input (nothing written).")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("history", type=Path, help="history directory or .jsonl file")
        parser.add_argument("-o", "--output", type=Path, required=True, metavar="SITE",
                            help="site directory (replaced whole; a new, empty or earlier "
                                 "site directory)")
        parser.add_argument("--threshold", type=float,
                            help="relative slowdown a regression needs (default: each "
                                 "suite's regression_threshold, else the backend's minimum "
                                 "effect, as nightly)")

    @classmethod
    def run(cls, args):
        from harness.jobs import nightly
        from reports import site
        from reports.record import read_dir

        if args.threshold is not None:
            check_fraction(args.threshold)
        site.check_output(args.output)
        history = read_dir(args.history)
        # Staged, then renamed into place (reports.site.writer): a stop writes nothing.
        done = stoppable(lambda: nightly.publish(history, args.history, args.output,
                                                  threshold=args.threshold),
                          "the site was not written")
        print(nightly.published_text(done))
        return 0


class Trace(Command):
    name = "trace"
    help = "summarize a profiler capture: per device busy time, executions, top ops, steps"
    description = ("Reads a JAX profiler capture (a .xplane.pb file, or a logdir holding one: "
                   "the newest is read) and prints, per device plane with work, its busy, "
                   "memcpy and span ms, executions per module and top ops, and per annotated "
                   "step its wall and busy ms and executions (harness.measure.xplane: XLA:CPU host "
                   "ops, TPU module/op lines, GPU kernels tied to host dispatches).")

    @classmethod
    def setup(cls, parser):
        parser.add_argument("path", type=Path, help=".xplane.pb file or a directory above one")
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.add_argument("--full", action="store_true",
                            help="print each top op's whole HLO instruction below its row")

    @classmethod
    def run(cls, args):
        import json

        from harness.measure import trace

        if args.path.is_dir():
            try:
                path = trace.find_xplane(str(args.path))
            except FileNotFoundError:
                raise ValueError(f"{args.path}: no .xplane.pb below it; give a capture file "
                                 "or the logdir of one") from None
        elif args.path.is_file():
            path = str(args.path)
        else:
            raise ValueError(f"{args.path}: no such capture file or directory")
        try:
            summary = trace.summarize(path)
        except Exception as err:  # not an XSpace protobuf: one line, not a traceback
            raise ValueError(f"{path}: cannot read it as a profiler capture "
                             f"({type(err).__name__}: {err})") from None
        print(json.dumps(summary, indent=1) if args.json else trace.text(summary, args.full))
        return 0


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
        from arms.selftest import selftest

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

        from harness.orchestrator.environment import cell_environment

        print(json.dumps(cell_environment(args.cpu_devices)[1], indent=1))
        return 0


class Arms(Command):
    name = "arms"
    help = "list the arms and whether each can run in this Python environment"
    description = ("Lists every named arm (trainer on model) and whether this environment "
                   "can run it; for one that cannot, the packages it needs, the versions "
                   "found and the ones needed. Any TRAINER:MODEL pair is judged the same way "
                   "by `parity run`.")

    @classmethod
    def run(cls, args):
        from harness.jobs.grid import arm_table

        print(arm_table())
        return 0
