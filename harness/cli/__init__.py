"""The `parity` command line: argument parsing, printing and exit codes, over library
functions that do neither (harness.jobs, reports).

One `Command` class per subcommand, each with its arguments (`setup`) next to its handler
(`run`): the commands that run cells in harness.cli.grid_commands, those that read what runs
stored in harness.cli.stored.
"""

from __future__ import annotations

import argparse
import sys

from harness.cli.command import Command, Parser
from harness.cli.grid_commands import AB, Bisect, Launch, Nightly, Plan, Run, SelftestError
from harness.cli.kernels import Kernels
from harness.cli.stored import (
    Arms,
    Compare,
    Env,
    Explain,
    Publish,
    Report,
    Selftest,
    Trace,
)
from harness.cli.watch import Stopped

COMMANDS: tuple[type[Command], ...] = (Selftest, Env, Arms, Run, Plan, Launch, Nightly, AB,
                                        Bisect, Compare, Explain, Report, Publish, Trace, Kernels)


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
    from harness.store.results import WriteError

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
