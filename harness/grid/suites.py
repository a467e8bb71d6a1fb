"""The named suites: TOML files of grid options kept in the repository (`suites/NAME.toml`),
or a suite file of the user's (a path ending in `.toml`). Standard library only: the
commands that only read results (`publish`) find a suite's regression threshold here
without importing the grid, which imports JAX."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from pathlib import Path

SUITES_DIR = Path(__file__).parent / "suites"


def names() -> list[str]:
    """The named suites shipped with parity."""
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def read(name: str) -> dict:
    """Suite `name`'s options as written, with "name" (its file's stem) added; ValueError
    naming the valid suites when there is no such suite."""
    path = Path(name) if name.endswith(".toml") else SUITES_DIR / f"{name}.toml"
    if not path.is_file():
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(names())} "
                         "(or the path of a .toml suite file)")
    with path.open("rb") as f:
        suite = tomllib.load(f)
    suite["name"] = path.stem
    return suite


def thresholds(suites: Iterable[str]) -> dict[str, float]:
    """Each of `suites` that is shipped and sets a `regression_threshold` -> that threshold
    (the nightly's default for its cells)."""
    found = {}
    for name in sorted(set(suites)):
        path = SUITES_DIR / f"{name}.toml"
        if path.is_file():
            with path.open("rb") as f:
                threshold = tomllib.load(f).get("regression_threshold")
            if threshold is not None:
                found[name] = float(threshold)
    return found
