"""Running the `parity` CLI from tests, as a user would: a subprocess with the repository on
the path and no inherited XLA_FLAGS (cells choose their own devices)."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def parity_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    full_env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], env=full_env,
                          capture_output=True, text=True, timeout=300)
