"""The grid commands' arguments (run, plan, nightly, ab, launch), and what they ask for as a
harness.jobs.grid.Request. The choices offered (arms, losses, optimizers, remat policies,
suites) are read from the modules that own them."""

from __future__ import annotations

import argparse
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
    from arms.workload.tunix_grpo import AGG_MODES
    from harness.grid import suites

    parser.add_argument("--suite", help=f"named suite ({', '.join(suites.names())}); other "
                                        "options override it")
    parser.add_argument("--arms", type=_csv(str), help=f"comma-separated arms: {arms_help()}")
    parser.add_argument("--preset", type=_csv(str), help="model preset(s)")
    parser.add_argument("--seq", type=_csv(int), help="sequence length(s)")
    parser.add_argument("--batch", type=_csv(int), help="global batch size(s) per step")
    parser.add_argument("--micro-batch", type=_csv(int),
                        help="rows per micro-batch instead of --batch: each cell's batch is "
                             "this x its GA (the memory a step needs follows the micro-batch)")
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
    parser.add_argument("--loss", choices=list(LOSSES),
                        help="workload loss; tunix-grpo is Tunix's own grpo_loss_fn on "
                             "rollouts (prompt + completion)")
    parser.add_argument("--loss-agg-mode", choices=AGG_MODES,
                        help="tunix-grpo: Tunix's loss aggregation (default token-mean)")
    parser.add_argument("--beta", type=float, help="tunix-grpo: KL penalty weight (default 0)")
    parser.add_argument("--epsilon", type=float, help="tunix-grpo: ratio clip (default 0.2)")
    parser.add_argument("--epsilon-high", type=float,
                        help="tunix-grpo: upper ratio clip (default: --epsilon)")
    parser.add_argument("--epsilon-c", type=float, help="tunix-grpo: dual-clip bound (> 1)")
    parser.add_argument("--optimizer", choices=list(OPTIMIZERS), help="optax optimizer")
    parser.add_argument("--ragged", type=_csv(int), help="loss tokens per micro-batch, e.g. "
                                                         "64,16,40,8 (applies where GA matches)")
    add_decoder_arguments(parser)
    parser.add_argument("--timeout", type=float, help="seconds before a cell is killed")
    parser.add_argument("--cpu-devices", type=int, help="emulate N CPU devices (CPU backend)")
    parser.add_argument("--no-parity", action="store_true", help="skip the exact-gradient check")
    parser.add_argument("--plugin", action="append", help="module registering extra arms")
    _add_device_arguments(parser)


def _add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of the device a grid runs on: its fit check, and waiting for it."""
    parser.add_argument("--no-fit-check", action="store_true",
                        help="on an accelerator, build a cell without first planning its step "
                             "for the device (by default a cell whose planned peak exceeds "
                             "the device's memory is refused before it is built)")
    parser.add_argument("--fit-gib", type=float,
                        help="GiB one device may use, for the fit check (default: the "
                             "device's own limit; on CPU, given, it turns the check on)")
    parser.add_argument("--wait-for-device", type=float, metavar="SECONDS",
                        help="where another process holds the accelerator (a TPU opens to "
                             "one process at a time), wait up to SECONDS for it instead of "
                             "stopping at once (exit 2, nothing written)")


def add_decoder_arguments(parser: argparse.ArgumentParser) -> None:
    """The model options: how layers are laid out and rematerialized, and how our decoder
    computes attention and its logits (the same function either way)."""
    from engine.model.config import ATTENTION_KINDS, REMAT_POLICIES, SCAN_BACKWARDS

    parser.add_argument("--scan-layers", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--remat", choices=list(REMAT_POLICIES))
    parser.add_argument("--attention", choices=list(ATTENTION_KINDS),
                        help="our decoder's attention: xla (default), splash (JAX's Pallas "
                             "kernel; interpret mode off a TPU: slow) or auto (splash on a "
                             "TPU from seq 2048 up, xla elsewhere)")
    parser.add_argument("--attention-block-q", type=int,
                        help="query rows per attention-kernel block (default 512)")
    parser.add_argument("--attention-block-kv", type=int,
                        help="keys per attention-kernel block (default 1024)")
    parser.add_argument("--logits-chunk", type=int,
                        help="positions per chunk of our decoder's head and loss (no [B, S, V] "
                             "float32 logits); 0 (default): the whole logits at once")
    parser.add_argument("--scan-backward", choices=list(SCAN_BACKWARDS),
                        help="how our decoder's scanned blocks are differentiated: jax "
                             "(default: the scan's transpose, its stacked weight gradient "
                             "zero-filled first) or unfilled (written into a buffer never "
                             "filled; needs --scan-layers --remat full)")


def request(args: argparse.Namespace, out: Path):
    """What the grid arguments ask for (a harness.jobs.grid.Request; None where an option
    was not given)."""
    from harness.jobs.grid import Request

    explicit = {
        "arms": args.arms, "preset": args.preset, "seq": args.seq, "batch": args.batch,
        "micro_batch": args.micro_batch,
        "ga": args.ga, "steps": args.steps, "warmup": args.warmup, "rounds": args.rounds,
        "dtype": DTYPES.get(args.dtype, args.dtype), "mesh": args.mesh, "loss": args.loss,
        "optimizer": args.optimizer, "ragged": args.ragged, "timeout_s": args.timeout,
        "cpu_devices": args.cpu_devices, "trace_steps": args.trace_steps,
        "scan_layers": args.scan_layers, "remat": args.remat, "trace": args.trace,
        "attention": args.attention, "attention_block_q": args.attention_block_q,
        "attention_block_kv": args.attention_block_kv, "logits_chunk": args.logits_chunk,
        "scan_backward": args.scan_backward,
        "trace_hlo": args.trace_hlo, "parity": False if args.no_parity else None,
        "loss_agg_mode": args.loss_agg_mode, "beta": args.beta, "epsilon": args.epsilon,
        "epsilon_high": args.epsilon_high, "epsilon_c": args.epsilon_c,
        "fit_check": False if args.no_fit_check else None,
        "fit_bytes": None if args.fit_gib is None else int(args.fit_gib * 2**30),
        "wait_s": args.wait_for_device,
    }
    return Request(explicit=explicit, suite=args.suite, plugins=tuple(args.plugin or ()),
                   out=out)
