"""Running the `parity` CLI from tests, as a user would: a subprocess with the repository on
the path and no inherited XLA_FLAGS (cells choose their own devices)."""

import os
import subprocess
import sys
from pathlib import Path

from harness.cli import main

REPO = Path(__file__).resolve().parents[2]


def cli_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository on the path, no XLA_FLAGS and
    `extra`."""
    env = dict(os.environ, PYTHONPATH=str(REPO), **extra)
    env.pop("XLA_FLAGS", None)
    return env


def parity_cli(*args: str, prelude: str | None = None, timeout: float = 300,
               **env: str) -> subprocess.CompletedProcess:
    """`python -m harness.cli ARGS`; with `prelude`, `python -c PRELUDE ARGS` instead, for a
    test that must act inside the process before it calls `harness.cli.main(sys.argv[1:])`."""
    full_env = cli_env(**env)
    launcher = ["-c", prelude] if prelude else ["-m", "harness.cli"]
    return subprocess.run([sys.executable, *launcher, *args], env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def parity_main(capsys, *args: str) -> subprocess.CompletedProcess:
    """`parity ARGS` through the command line's entry point in this process: its exit code
    (argparse's own errors exit through SystemExit) and what it wrote, as `parity_cli`
    returns them. For what needs no process of its own: input refused before any process
    starts or anything is written, and the commands that only read stored results; an
    interpreter's start-up (~2 s) would be the whole cost. `parity_cli` runs the command
    as a user's shell does."""
    environ = dict(os.environ)
    try:
        code = main(list(args))
    except SystemExit as exit_:
        code = exit_.code
    finally:  # what a command sets for its own children stays out of the test's
        os.environ.clear()
        os.environ.update(environ)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["parity", *args], code, out, err)
