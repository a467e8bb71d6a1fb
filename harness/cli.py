"""The `parity` command line: a thin layer over importable library functions."""

from __future__ import annotations

import argparse
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parity", description="Performance-parity harness for JAX LLM training engines.")
    commands = parser.add_subparsers(dest="command", required=True)
    st = commands.add_parser(
        "selftest", help="param counts, a ragged-batch loss/gradient and decoder-vs-Tunix parity",
        description="Prints a preset's parameter count, the loss and exact-gradient norm on a "
                    "ragged batch, and our decoder vs Tunix Qwen3 logits parity on `tiny`.")
    st.add_argument("--preset", default="tiny", help="model preset for the loss check")
    st.set_defaults(func=_selftest)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as err:  # bad input: one clear line, no traceback
        print(f"parity: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
