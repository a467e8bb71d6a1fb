"""The environment cells run in: the variables they start with (emulated CPU devices, the
host allocator) and what they will record, read once from a short probe process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from harness.orchestrator.spawn import STDERR_TAIL
from harness.system import allocator
from harness.system.reaper import die_with_parent


def cpu_env(cpu_devices: int | None, base: dict | None = None) -> dict[str, str]:
    """The environment cells run in; `cpu_devices` emulates that many CPU devices."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
    return env


def cell_environment(cpu_devices: int | None, *,
                     planning: bool = False) -> tuple[dict[str, str], dict]:
    """(env, environment): the variables cells run with and the environment they will
    record (from one `probe`), the host allocator chosen by harness.system.allocator
    (`planning`: cells that compile for a TPU target and run nothing)."""
    env = cpu_env(cpu_devices)
    environment = probe(env)
    env = allocator.for_cells(env, environment["backend"], planning=planning)
    environment["host_malloc"] = allocator.describe(env)
    return env, environment


def probe(env: dict[str, str], timeout_s: float = 120) -> dict:
    """The environment cells will see (harness.system.environment), from a short
    subprocess."""
    proc = subprocess.run([sys.executable, "-m", "harness.system.environment"], env=env,
                          capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=die_with_parent(os.getpid()))
    if proc.returncode != 0:
        raise RuntimeError(f"could not start JAX in a subprocess:\n{proc.stderr[-STDERR_TAIL:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
