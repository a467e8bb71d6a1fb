"""The `parity` command line: a thin layer over importable library functions."""

from __future__ import annotations

import argparse
import json
import sys


def _selftest(args: argparse.Namespace) -> int:
    from harness.selftest import selftest

    try:
        for line in selftest(args.preset):
            print(line, flush=True)
    except AssertionError as err:
        print(err, file=sys.stderr)
        return 1
    return 0


def _env(args: argparse.Namespace) -> int:
    from harness.runner import cpu_env, probe

    print(json.dumps(probe(cpu_env(args.cpu_devices)), indent=1))
    return 0


def _report(args: argparse.Namespace) -> int:
    from reports.document import render
    from reports.records import ResultsError

    try:
        render(args.results, args.output, baseline_arm=args.baseline_arm)
    except ResultsError as err:
        print(f"parity: error: {err}", file=sys.stderr)
        return 2
    print(f"report: {args.output}")
    return 0


def _csv(kind):
    return lambda text: [kind(x) for x in text.split(",") if x.strip()]


def run_options(args: argparse.Namespace) -> dict:
    """Grid options from a suite (if any) overridden by explicit command-line values."""
    from harness.grid import load_suite

    options = load_suite(args.suite) if args.suite else {}
    explicit = {
        "arms": args.arms, "preset": args.preset, "seq": args.seq, "batch": args.batch,
        "ga": args.ga, "steps": args.steps, "warmup": args.warmup, "dtype": args.dtype,
        "mesh": args.mesh, "loss": args.loss, "optimizer": args.optimizer,
        "ragged": args.ragged, "timeout_s": args.timeout, "cpu_devices": args.cpu_devices,
        "trace_steps": args.trace_steps, "scan_layers": args.scan_layers, "remat": args.remat,
    }
    options.update({k: v for k, v in explicit.items() if v is not None})
    if args.trace is not None:
        options["trace"] = args.trace
    if args.no_parity:
        options["parity"] = False
    options.setdefault("arms", ["engine", "engine-fused", "native", "peft-decoder",
                                "peft-tunix"])
    return options


def _prepare(args: argparse.Namespace):
    """Plugins, options, environment and the validated cells of a grid command."""
    import dataclasses
    import importlib

    from harness import grid, runner

    for module in args.plugin or ():
        importlib.import_module(module)
    options = run_options(args)
    env = runner.cpu_env(options.get("cpu_devices"))
    fingerprint = runner.probe(env)
    processes = getattr(args, "num_processes", None) or 1
    available = {**fingerprint, "device_count": fingerprint["device_count"] * processes}
    cells = grid.expand(options, mesh_sizes=available)  # every bad input fails here
    trace_dir = str(args.out / "traces") if options.get("trace") else None
    cells = [dataclasses.replace(c, trace_dir=trace_dir, plugins=tuple(args.plugin or ()))
             for c in cells]
    print(f"parity: {len(cells)} cells on {fingerprint['backend']} "
          f"({fingerprint['device_count']} x {fingerprint['device_kind']}), "
          f"results -> {args.out}", flush=True)
    return options, env, fingerprint, cells


def _progress(total: int):
    from tqdm import tqdm

    from harness import summary

    bar = tqdm(total=total, unit="cell", file=sys.stderr, disable=not sys.stderr.isatty())

    def on_record(index, record):
        bar.update(1)
        tqdm.write(summary.cell_line(record), file=sys.stdout)

    return bar, on_record


def _run(args: argparse.Namespace) -> int:
    from harness import runner, summary

    options, env, fingerprint, cells = _prepare(args)
    bar, on_record = _progress(len(cells))
    try:
        path, records = runner.run_grid(cells, args.out, env=env,
                                        timeout_s=options.get("timeout_s", 600),
                                        suite=options.get("name"), on_record=on_record,
                                        fingerprint=fingerprint,
                                        distributed=_distributed(args), run_id=args.run_id)
    except KeyboardInterrupt:
        bar.close()
        print("parity: interrupted; finished cells are kept in the results file",
              file=sys.stderr)
        return 130
    bar.close()
    if args.process_id:
        return 0 if all(r["status"] == "ok" for r in records) else 1
    print(summary.table(records))
    if any(r.get("trace") for r in records):
        print(f"\ntraces: open with `xprof --logdir {args.out / 'traces'}` "
              "(or TensorBoard's profile plugin)")
    print(f"\nrecords: {path}")
    return 0 if all(r["status"] == "ok" for r in records) else 1


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


def _launch(args: argparse.Namespace) -> int:
    """Starts N local `parity run` processes that form one multi-process run."""
    import socket
    import subprocess

    if args.n < 1:
        raise ValueError("launch -n must be >= 1")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest = [a for a in args.run_args if a != "--"]
    run_id = f"launch-{port}"
    procs = [subprocess.Popen([sys.executable, "-m", "harness.cli", "run", *rest,
                               "--num-processes", str(args.n), "--process-id", str(i),
                               "--coordinator", f"127.0.0.1:{port}", "--run-id", run_id],
                              stdout=None if i == 0 else subprocess.DEVNULL)
             for i in range(args.n)]
    codes = [p.wait() for p in procs]
    return codes[0] if codes[0] else max(codes)


def _nightly(args: argparse.Namespace) -> int:
    from harness import nightly, runner

    args.out = args.history
    options, env, fingerprint, cells = _prepare(args)
    threshold = args.threshold or options.get("regression_threshold", 0.05)
    bar, on_record = _progress(len(cells))
    _, records = runner.run_grid(cells, args.history, env=env,
                                 timeout_s=options.get("timeout_s", 600),
                                 suite=options.get("name"), on_record=on_record,
                                 fingerprint=fingerprint)
    bar.close()
    code, text = nightly.evaluate(records, args.history, threshold=threshold,
                                  report_dir=args.report or args.history / "nightly")
    print(text)
    return code


def _ab(args: argparse.Namespace) -> int:
    from harness import ab

    ab.resolve_ref(args.ref_a)
    ab.resolve_ref(args.ref_b)
    ab.check_clean([args.ref_a, args.ref_b], allow_dirty=args.allow_dirty)
    options, env, _, cells = _prepare(args)
    bar, on_record = _progress(len(cells) * 2 * args.rounds)
    rows = ab.run_ab(args.ref_a, args.ref_b, cells, args.out, env=env,
                     timeout_s=options.get("timeout_s", 600), rounds=args.rounds,
                     on_record=on_record, min_effect=args.threshold)
    bar.close()
    text = ab.markdown(args.ref_a, args.ref_b, rows, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab.md").write_text(text)
    print(text)
    return 0


def add_grid_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", help="named suite from harness/suites (cpu-default, gpu-h200,"
                                     " tpu7x-nightly); other options override it")
    parser.add_argument("--arms", type=_csv(str), help="comma-separated arm names")
    parser.add_argument("--preset", type=_csv(str), help="model preset(s)")
    parser.add_argument("--seq", type=_csv(int), help="sequence length(s)")
    parser.add_argument("--batch", type=_csv(int), help="global batch size(s) per step")
    parser.add_argument("--ga", type=_csv(int), help="gradient-accumulation step(s)")
    parser.add_argument("--steps", type=int, help="timed steps per cell")
    parser.add_argument("--warmup", type=int, help="untimed warmup steps (>= 1)")
    parser.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                     help="capture a separate traced window after timing")
    parser.add_argument("--trace-steps", type=int, help="steps in the traced window")
    parser.add_argument("--mesh", help="mesh, e.g. fsdp=8 or fsdp=4,tensor=2")
    parser.add_argument("--dtype", choices=["f32", "bf16", "float32", "bfloat16"],
                     help="compute dtype")
    parser.add_argument("--loss", choices=["xent", "grpo"], help="workload loss")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], help="optax optimizer")
    parser.add_argument("--ragged", type=_csv(int), help="loss tokens per micro-batch, e.g. "
                                                      "64,16,40,8 (applies where GA matches)")
    parser.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--remat", choices=["none", "minimal", "full"])
    parser.add_argument("--timeout", type=float, help="seconds before a cell is killed")
    parser.add_argument("--cpu-devices", type=int, help="emulate N CPU devices (CPU backend)")
    parser.add_argument("--no-parity", action="store_true", help="skip the exact-gradient check")
    parser.add_argument("--plugin", action="append", help="module registering extra arms")


def build_parser() -> argparse.ArgumentParser:
    from pathlib import Path

    parser = argparse.ArgumentParser(
        prog="parity", description="Performance-parity harness for JAX LLM training engines.")
    commands = parser.add_subparsers(dest="command", required=True)

    st = commands.add_parser(
        "selftest", help="param counts, a ragged-batch loss/gradient and decoder-vs-Tunix parity",
        description="Prints a preset's parameter count, the loss and exact-gradient norm on a "
                    "ragged batch, and our decoder vs Tunix Qwen3 logits parity on `tiny`.")
    st.add_argument("--preset", default="tiny", help="model preset for the loss check")
    st.set_defaults(func=_selftest)

    env = commands.add_parser("env", help="print the comparability fingerprint",
                              description="Prints the fingerprint cells would record "
                                          "(git sha, versions, backend, devices, XLA flags).")
    env.add_argument("--cpu-devices", type=int, help="emulate N CPU devices")
    env.set_defaults(func=_env)

    run = commands.add_parser(
        "run", help="run a grid of cells (one subprocess each) and store the records",
        description="Runs arm x preset x seq x batch x GA cells, each in its own process: "
                    "warmup, untraced timing, memory, optional trace, gradient parity.")
    add_grid_arguments(run)
    run.add_argument("--out", type=Path, default=Path("results"), help="results directory")
    run.add_argument("--num-processes", type=int, help="processes of a multi-process run")
    run.add_argument("--process-id", type=int, help="this process's index (0 writes)")
    run.add_argument("--coordinator", help="HOST:PORT of process 0 (cell k uses PORT + k)")
    run.add_argument("--distributed-auto", action="store_true",
                     help="let jax.distributed detect the cluster (e.g. Cloud TPU)")
    run.add_argument("--run-id", help="name of the results file (default: a timestamp)")
    run.set_defaults(func=_run)

    launch = commands.add_parser(
        "launch", help="start N local processes of one multi-process `parity run`",
        description="parity launch -n 2 -- --arms engine --preset tiny --cpu-devices 4 ...: "
                    "runs `parity run` N times on this machine as one jax.distributed job.")
    launch.add_argument("-n", type=int, required=True, help="number of processes")
    launch.add_argument("run_args", nargs=argparse.REMAINDER, help="arguments of `run`")
    launch.set_defaults(func=_launch)

    nightly = commands.add_parser(
        "nightly", help="run a suite, append to the history, exit 1 on a regression",
        description="Runs the grid, appends its records to HISTORY and compares each cell "
                    "with the comparable history (exit 0 ok, 1 regression, 2 broken run).")
    add_grid_arguments(nightly)
    nightly.add_argument("--history", type=Path, required=True, help="history directory")
    nightly.add_argument("--threshold", type=float,
                         help="relative slowdown that counts (default: suite's, else 0.05)")
    nightly.add_argument("--report", type=Path, help="where nightly.md and plots go")
    nightly.set_defaults(func=_nightly)

    ab_cmd = commands.add_parser(
        "ab", help="A/B two git refs: the same cells, interleaved A B A B",
        description="Checks out REF_A and REF_B as git worktrees and runs the same cells "
                    "from each, interleaved, for --rounds rounds; reports the ratio of "
                    "medians with a 95%% CI, a verdict and the minimum detectable effect. "
                    "`parity ab HEAD HEAD` measures the noise floor.")
    ab_cmd.add_argument("ref_a")
    ab_cmd.add_argument("ref_b")
    add_grid_arguments(ab_cmd)
    ab_cmd.add_argument("--rounds", type=int, default=3, help="interleaved rounds (>= 3)")
    ab_cmd.add_argument("--threshold", type=float, default=0.05,
                        help="smallest relative difference that earns a verdict (0.05)")
    ab_cmd.add_argument("--allow-dirty", action="store_true",
                        help="allow uncommitted changes (HEAD is measured as committed)")
    ab_cmd.add_argument("--out", type=Path, default=Path("results/ab"), help="results dir")
    ab_cmd.set_defaults(func=_ab)

    report = commands.add_parser(
        "report", help="write the markdown parity document and plots from results",
        description="Reads every *.jsonl record under RESULTS and writes a markdown document "
                    "with PNG plots beside it (relative links).")
    report.add_argument("results", type=Path, help="results directory or .jsonl file")
    report.add_argument("-o", "--output", type=Path, default=Path("parity.md"))
    report.add_argument("--baseline-arm", default="peft-decoder",
                        help="arm the speedup and memory ratios are taken against")
    report.set_defaults(func=_report)
    return parser


DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "dtype", None):
        args.dtype = DTYPES.get(args.dtype, args.dtype)
    try:
        return args.func(args)
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"parity: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
