"""What each arm needs installed beyond the core stack (jax, flax, optax, orbax), and whether
this Python environment has it, read from package metadata without importing anything.

The core arms (our engine, the native step) run on any JAX from 0.10.2 on. Tunix's trainer
and model need `google-tunix`. MaxText's model and engine need `maxtext` 0.2.5, which itself
needs Python >= 3.12 and jax >= 0.11.2 (on jax 0.10.2 it fails to import:
`jax.experimental.xla_metadata` has no `must_fuse_call`) with flax >= 0.12.12 (flax 0.12.9
on jax 0.11.2 fails: `jax.experimental.hijax` has no `HiPrimitive`). A TPU VM image brings its
own JAX, so on such a host the MaxText arms may not be available: `parity arms` lists them,
`parity run` refuses one named explicitly with one line, and skips one a suite names.
"""

from __future__ import annotations

import dataclasses
import platform
from importlib.metadata import PackageNotFoundError, version

from packaging.specifiers import SpecifierSet
from packaging.version import Version

PYTHON = "python"
"""The name a `Need` gives the interpreter itself."""


@dataclasses.dataclass(frozen=True)
class Need:
    """One package (or Python) an arm needs, at versions `spec` admits."""

    package: str
    """Distribution name as pip knows it, or PYTHON."""
    spec: str
    """PEP 440 specifier ('>=0.11.2')."""


MAXTEXT = (Need(PYTHON, ">=3.12"), Need("maxtext", ">=0.2.5"), Need("jax", ">=0.11.2"),
           Need("flax", ">=0.12.12"))
TUNIX = (Need("google-tunix", ">=0.1.7"),)

NEEDS: dict[str, tuple[Need, ...]] = {
    "maxtext": MAXTEXT,  # the model kind
    "maxtext-engine": MAXTEXT,  # the trainer
    "tunix": TUNIX,
    "peft": TUNIX,
}
"""Trainer or model kind -> what it needs beyond the core stack."""


def found_versions() -> dict[str, str | None]:
    """The installed version of every package a Need names (None: not installed), and
    Python's."""
    found: dict[str, str | None] = {PYTHON: platform.python_version()}
    for need in {n for needs in NEEDS.values() for n in needs if n.package != PYTHON}:
        try:
            found[need.package] = version(need.package)
        except PackageNotFoundError:
            found[need.package] = None
    return found


def unmet(needs: tuple[Need, ...], found: dict[str, str | None]) -> list[str]:
    """Each need `found` does not meet, in words: 'maxtext not installed (>=0.2.5 needed)',
    'jax 0.10.2 found, >=0.11.2 needed'."""
    missing = []
    for need in needs:
        have = found.get(need.package)
        name = "Python" if need.package == PYTHON else need.package
        if have is None:
            missing.append(f"{name} not installed ({need.spec} needed)")
        elif Version(have) not in SpecifierSet(need.spec):
            missing.append(f"{name} {have} found, {need.spec} needed")
    return missing


def why_unavailable(trainer: str, model: str,
                    found: dict[str, str | None] | None = None) -> str | None:
    """Why an arm of `trainer` on `model` cannot run in this environment (one line), or
    None where it can. `found`: the versions to judge by (default: this environment's)."""
    found = found_versions() if found is None else found
    needs = dict.fromkeys((*NEEDS.get(trainer, ()), *NEEDS.get(model, ())))
    missing = unmet(tuple(needs), found)
    return "; ".join(missing) or None
