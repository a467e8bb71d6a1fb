"""The environment cells run in: the variables they start with (emulated CPU devices, the
host allocator) and what they will record, read once from a short probe process."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

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


def cell_environment(cpu_devices: int | None, *, planning: bool = False,
                     wait_s: float = 0.0) -> tuple[dict[str, str], dict]:
    """(env, environment): the variables cells run with and the environment they will
    record (from one `probe`, which waits up to `wait_s` for an accelerator another process
    holds), the host allocator chosen by harness.system.allocator (`planning`: cells that
    compile for a TPU target and run nothing)."""
    env = cpu_env(cpu_devices)
    environment = probe(env, wait_s=wait_s)
    env = allocator.for_cells(env, environment["backend"], planning=planning)
    environment["host_malloc"] = allocator.describe(env)
    return env, environment


HELD = re.compile(r"TPU is already in use by process with pid (\d+)")
"""What libtpu says when another process holds the chip (only one process may open it)."""
POLL_S = 5.0
"""How often a run waiting for a held accelerator probes it again."""


class DeviceHeldError(ValueError):
    """Another process holds the accelerator: one line naming it and what to do (the
    command line prints it and exits 2, before anything is written)."""


def holder(stderr: str) -> int | None:
    """The pid of the process libtpu says holds the chip, from a probe's output; None where
    it says nothing of the kind."""
    found = HELD.search(stderr)
    return int(found.group(1)) if found else None


def held_message(pid: int, waited_s: float) -> str:
    """'the TPU is held by process 123 (python3 -m harness.cli run ...): ...' in one line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            words = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        words = ""
    what = f" ({words[:160]})" if words else ""
    waited = f" after waiting {waited_s:.0f} s" if waited_s else ""
    return (f"the TPU is held by process {pid}{what}{waited}; only one process may open it: "
            f"wait for that one to end (or stop it: kill {pid}), or pass "
            "--wait-for-device SECONDS to wait for it")


def probe(env: dict[str, str], timeout_s: float = 120, wait_s: float = 0.0) -> dict:
    """The environment cells will see (harness.system.environment), from a short
    subprocess. Where another process holds the accelerator, probes again every POLL_S
    seconds for up to `wait_s`, then raises DeviceHeldError."""
    deadline = time.monotonic() + wait_s
    while True:
        proc = subprocess.run([sys.executable, "-m", "harness.system.environment"], env=env,
                              capture_output=True, text=True, timeout=timeout_s,
                              preexec_fn=die_with_parent(os.getpid()))
        pid = holder(proc.stderr)
        if pid is None:
            break
        if time.monotonic() >= deadline:
            raise DeviceHeldError(held_message(pid, wait_s))
        time.sleep(POLL_S)
    if proc.returncode != 0:
        raise RuntimeError(f"could not start JAX in a subprocess:\n{proc.stderr[-STDERR_TAIL:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
