"""What each arm needs beyond the core stack (jax, flax, optax, orbax), and whether this
Python environment has it: what works here, not what a package's metadata pins.

Two kinds of need:
- a package installed at a version (`Need`), read from package metadata without importing
  anything: Tunix's trainer and model need `google-tunix`, MaxText's model and engine
  `maxtext`;
- the modules an arm's build imports importing here (`IMPORTS`): MaxText's model, and its
  training engine. maxtext 0.2.5 declares Python >= 3.12 and jax >= 0.11.2, yet its model
  and engine run on the TPU v5e host's Python 3.11 / jax 0.10.2 with the shims of
  arms.models.maxtext_compat (each names the upstream line it works around), computing the
  same numbers as on the 3.12 stack. So whether the MaxText arms can run is decided by
  importing them, through the same `require_maxtext` their build calls, not by version pins.
  The import is checked in a child interpreter with JAX on the CPU (`import_failures`):
  importing MaxText takes seconds and changes JAX's and flax's global state, which a
  command that only asks (`parity arms`, a grid's check) must not, and a process on a TPU
  host must not open the chip for it. Its answer is kept per environment
  (`${XDG_CACHE_HOME:-~/.cache}/parity/imports/`), keyed by the interpreter, every installed
  distribution's version and the arms package's own files, so that it is asked again only
  where one of those changed.

`parity arms` lists every arm and, for one that cannot run, why (the package missing, or the
import's own error); `parity run` refuses one named explicitly with that line and sets aside
one a suite names.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path

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
    """PEP 440 specifier ('>=0.1.7')."""


MAXTEXT_MODEL, MAXTEXT_ENGINE = "MaxText's model", "MaxText's training engine"
"""The import checks: the modules `arms.models.maxtext_qwen3.require_maxtext` imports for
the model (`engine=False`) and, beyond them, for the engine (`engine=True`)."""

MAXTEXT = (Need("maxtext", ">=0.2.5"),)
TUNIX = (Need("google-tunix", ">=0.1.7"),)

NEEDS: dict[str, tuple[Need, ...]] = {
    "maxtext": MAXTEXT,  # the model kind
    "maxtext-engine": MAXTEXT,  # the trainer
    "tunix": TUNIX,
    "peft": TUNIX,
}
"""Trainer or model kind -> the packages it needs beyond the core stack."""

IMPORTS: dict[str, tuple[str, ...]] = {
    "maxtext": (MAXTEXT_MODEL,),
    "maxtext-engine": (MAXTEXT_MODEL, MAXTEXT_ENGINE),
}
"""Trainer or model kind -> the import checks its build must pass here."""

PROBE_TIMEOUT_S = 300
"""Bound on the child interpreter's import of MaxText (~6 s on the CPU machine)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Found:
    """What an environment has, as the availability rule reads it."""

    versions: Mapping[str, str | None]
    """Package (or PYTHON) -> the version installed, None where it is not."""
    imports: Mapping[str, str | None] | None = None
    """Import check -> why it failed (one line), None where it imported; None: check this
    environment (`import_failures`), when an arm asks for one."""


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


def unmet(needs: tuple[Need, ...], found: Mapping[str, str | None]) -> list[str]:
    """Each need `found` does not meet, in words: 'maxtext not installed (>=0.2.5 needed)',
    'google-tunix 0.1.6 found, >=0.1.7 needed'."""
    missing = []
    for need in needs:
        have = found.get(need.package)
        name = "Python" if need.package == PYTHON else need.package
        if have is None:
            missing.append(f"{name} not installed ({need.spec} needed)")
        elif Version(have) not in SpecifierSet(need.spec):
            missing.append(f"{name} {have} found, {need.spec} needed")
    return missing


def environment_key() -> str:
    """What an import check's answer depends on, hashed: the interpreter, every installed
    distribution's name and version, and the files of this package (the shims, the imports
    `require_maxtext` makes)."""
    digest = hashlib.sha256()
    digest.update(f"{sys.executable}\0{platform.python_version()}\0".encode())
    for name in sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()):
        digest.update(name.encode() + b"\0")
    package = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


def imports_dir() -> Path:
    """Where import checks' answers are kept: `${XDG_CACHE_HOME:-~/.cache}/parity/imports`."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "parity" / "imports"


@functools.cache
def import_failures() -> dict[str, str | None]:
    """Import check -> why it failed here (None: it imported), from a child interpreter of
    this environment with JAX on the CPU, or its answer kept for this environment (module
    docstring); once per process."""
    kept = imports_dir() / f"{environment_key()}.json"
    try:
        return json.loads(kept.read_text())
    except (OSError, ValueError):
        pass
    repo = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")]))}
    try:
        proc = subprocess.run([sys.executable, "-m", "arms.requirements"], cwd=repo, env=env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        found = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as err:
        why = f"the import check did not finish ({type(err).__name__}: {err})"
        return {MAXTEXT_MODEL: why, MAXTEXT_ENGINE: why}  # not kept: it may finish next time
    try:  # written whole or not at all: a reader never sees half an answer
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(found))
        partial.replace(kept)
    except OSError:
        pass  # a cache that cannot be written costs the next command the check, no more
    return found


def _check_imports() -> dict[str, str | None]:
    """The import checks, in this process (the child of `import_failures`)."""
    from arms.models.maxtext_qwen3 import require_maxtext

    failures: dict[str, str | None] = {}
    for check, engine in ((MAXTEXT_MODEL, False), (MAXTEXT_ENGINE, True)):
        try:
            require_maxtext(engine=engine)
            failures[check] = None
        except ImportError as err:  # require_maxtext's own line, naming the fix
            failures[check] = str(err).splitlines()[0]
        except Exception as err:  # an import that raised something else: not available either
            failures[check] = f"{type(err).__name__}: {(str(err) or '?').splitlines()[0]}"
    return failures


def why_unavailable(trainer: str, model: str, found: Found | None = None) -> str | None:
    """Why an arm of `trainer` on `model` cannot run in this environment (one line), or
    None where it can. `found`: what to judge by (default: this environment)."""
    versions = found.versions if found is not None else found_versions()
    needs = dict.fromkeys((*NEEDS.get(trainer, ()), *NEEDS.get(model, ())))
    missing = unmet(tuple(needs), versions)
    if missing:
        return "; ".join(missing)
    checks = dict.fromkeys((*IMPORTS.get(model, ()), *IMPORTS.get(trainer, ())))
    if not checks:
        return None
    failures = found.imports if found is not None and found.imports is not None else (
        import_failures())
    for check in checks:  # the first that fails (the engine's imports include the model's)
        if failures.get(check):
            return f"{check} does not import here: {failures[check]}"
    return None


if __name__ == "__main__":
    print(json.dumps(_check_imports()))
