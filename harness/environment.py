"""The comparability fingerprint: what must match for two measurements to be compared."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "google-tunix", "maxtext")
WHERE_INSTALLED = ("libtpu",)
"""Recorded only where installed: libtpu (a TPU host's `jax[tpu]`) is the XLA:TPU compiler
and runtime, so a libtpu upgrade changes the programs a TPU runs and records across it are
not compared. Left out where absent, so records of CPU and GPU hosts keep the versions they
always had (the libtpu `parity plan` loads by path is not an installed package here)."""


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state() -> dict:
    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "git_dirty": bool(dirty) if dirty is not None else None}


def versions() -> dict[str, str | None]:
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    for name in WHERE_INSTALLED:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            found[name] = importlib.metadata.version(name)
    return found


def host_malloc(env: dict[str, str]) -> str:
    """The allocator settings in `env`, as `K=V K=V`: glibc's `MALLOC_*` variables,
    `GLIBC_TUNABLES` where it sets a `glibc.malloc` tunable, mimalloc's `MIMALLOC_*`, and
    `LD_PRELOAD` as the file names of the malloc libraries it preloads (jemalloc, tcmalloc,
    mimalloc). The runner records them for the variables it starts cells with
    (harness.runner.cell_environment, run_grid)."""
    found = {k: v for k, v in env.items() if k.startswith(("MALLOC_", "MIMALLOC_"))
             or (k == "GLIBC_TUNABLES" and "glibc.malloc." in v)}
    names = (os.path.basename(p) for p in env.get("LD_PRELOAD", "").replace(":", " ").split())
    preloaded = [name for name in names if "malloc" in name]
    if preloaded:
        found["LD_PRELOAD"] = ",".join(preloaded)
    return " ".join(f"{k}={v}" for k, v in sorted(found.items()))


def environment() -> dict:
    """Fingerprint of this process's JAX environment (initializes the backend)."""
    import jax

    devices = jax.devices()
    return {
        **git_state(),
        "versions": versions(),
        "python": platform.python_version(),
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "process_count": jax.process_count(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "host": platform.node(),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(environment()))
