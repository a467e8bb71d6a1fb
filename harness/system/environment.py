"""The comparability fingerprint: what must match for two measurements to be compared.

`python -m harness.system.environment` prints this process's fingerprint as one JSON line:
the probe the parent runs once, with the environment variables cells will run with, before
any cell (`harness.orchestrator.environment`).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform

from harness.system import git

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "google-tunix", "maxtext")
WHERE_INSTALLED = ("libtpu",)
"""Recorded only where installed: libtpu (a TPU host's `jax[tpu]`) is the XLA:TPU compiler
and runtime, so a libtpu upgrade changes the programs a TPU runs and records across it are
not compared. Left out where absent, so records of CPU and GPU hosts keep the versions they
always had (the libtpu `parity plan` loads by path is not an installed package here)."""


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


def environment() -> dict:
    """Fingerprint of this process's JAX environment (initializes the backend)."""
    import jax

    devices = jax.devices()
    return {
        **git.state(),
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
