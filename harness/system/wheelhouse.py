"""What an offline host installs, and from where (`make wheelhouse`; docs/install.md).

An offline host brings its own JAX, and may have a local package index holding some of what
parity needs. From the runtime part of `requirements-py311.lock` (above "test only"), less
what the host has installed (`--host-has`), this writes two lists into the wheelhouse:

- `requirements.txt`: the pinned packages whose wheels are downloaded here and carried over;
- `from-index.txt`: the packages the host's own index provides (`--host-index`), each
  constrained by the range `pyproject.toml` supports where it names the package, and left
  unpinned where it does not (a dependency of a dependency: matplotlib's pillow and
  fonttools, orbax's tensorstore), since a host's index holds the versions its image was
  built with, not this lock's. The host installs them with `pip install -r` against its
  index, which picks a version within each range, or refuses naming the package.

A wheel may be carried without data it holds that nothing parity runs ever reads
(`SLIM`, `--slim`): maxtext's tokenizer assets (10.8 MB of its 13.5 MB wheel), read only
where MaxText tokenizes text (its input pipeline; every arm feeds synthetic token ids). The
wheel is rewritten without those files and without their lines in its RECORD, so pip installs
it as any other; its code is untouched (tests/harness/system/test_wheelhouse.py).

Standard library only: `make wheelhouse` runs it with any Python 3.11+, before any install.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

TEST_ONLY = "# test only"
"""The line of a lock after which its packages serve the tests alone."""
SLIM: dict[str, tuple[str, ...]] = {"maxtext": ("maxtext/assets/tokenizers/",)}
"""Distribution -> the directories of its wheel that are carried without their files: data
(no module) that no arm reads."""


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_pins(lock: str) -> dict[str, str]:
    """canonical name -> the lock's pin line, for the runtime part of a lock."""
    pins = {}
    for line in lock.split(TEST_ONLY)[0].splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            pins[canonical(line.split("==")[0])] = line
    return pins


def supported_ranges(pyproject: str) -> dict[str, str]:
    """canonical name -> its requirement in pyproject.toml's dependencies (the range)."""
    ranges = {}
    for requirement in tomllib.loads(pyproject)["project"]["dependencies"]:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
        ranges[canonical(name)] = requirement.replace(" ", "")
    return ranges


def split(lock: str, pyproject: str, host_has: list[str], host_index: list[str]
          ) -> tuple[list[str], list[str]]:
    """(the pins to download, the requirements the host's index installs). Raises
    ValueError for a package named to come from the index that the lock does not hold."""
    pins = runtime_pins(lock)
    has = {canonical(n) for n in host_has}
    index = [canonical(n) for n in host_index]
    unknown = [n for n in index if n not in pins]
    if unknown:
        raise ValueError(f"HOST_INDEX names {', '.join(unknown)}, which the lock's runtime "
                         "part does not hold; name packages of requirements-py311.lock")
    ranges = supported_ranges(pyproject)
    download = [pin for name, pin in pins.items() if name not in has and name not in index]
    from_index = [ranges.get(name, name) for name in index if name not in has]
    return download, from_index


def slim(wheel: Path, drop: tuple[str, ...]) -> int:
    """Rewrites `wheel` in place without the files under `drop` (and their RECORD lines);
    returns the compressed bytes left out. Refuses (ValueError) to leave out a module."""
    with zipfile.ZipFile(wheel) as source:
        dropped = [i for i in source.infolist() if i.filename.startswith(drop)]
        modules = [i.filename for i in dropped if i.filename.endswith((".py", ".so"))]
        if modules:
            raise ValueError(f"{wheel.name}: {modules[0]} is code, not data: only data is "
                             "left out of a wheel")
        left_out = {i.filename for i in dropped}
        with (tempfile.NamedTemporaryFile(dir=wheel.parent, suffix=".whl",
                                          delete=False) as tmp,
              zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as target):
            for item in source.infolist():
                if item.filename in left_out:
                    continue
                data = source.read(item)
                if item.filename.endswith(".dist-info/RECORD"):
                    data = "".join(line for line in data.decode().splitlines(True)
                                   if line.split(",")[0] not in left_out).encode()
                target.writestr(item, data)
    shutil.move(tmp.name, wheel)
    return sum(i.compress_size for i in dropped)


def slim_all(wheelhouse: Path) -> list[str]:
    """Each wheel of SLIM's distributions in `wheelhouse` slimmed; one line each."""
    said = []
    for name, drop in SLIM.items():
        for wheel in sorted(wheelhouse.glob(f"{name}-*.whl")):
            left_out = slim(wheel, drop)
            said.append(f"{wheel.name}: left out {left_out / 1e6:.1f} MB under "
                        f"{', '.join(drop)}")
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Writes the offline host's install lists.")
    parser.add_argument("--lock", type=Path, default=Path("requirements-py311.lock"))
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("--host-has", default="", help="packages the host has installed")
    parser.add_argument("--host-index", default="", help="packages the host's index holds")
    parser.add_argument("--out", type=Path, required=True, help="the wheelhouse directory")
    parser.add_argument("--slim", action="store_true",
                        help="rewrite the downloaded wheels SLIM names without the data no "
                             "arm reads (after the download)")
    args = parser.parse_args(argv)
    if args.slim:
        try:
            print("\n".join(slim_all(args.out)))
        except (ValueError, OSError, zipfile.BadZipFile) as err:
            print(f"wheelhouse: error: {err}", file=sys.stderr)
            return 2
        return 0
    try:
        download, from_index = split(args.lock.read_text(), args.pyproject.read_text(),
                                     args.host_has.split(), args.host_index.split())
    except ValueError as err:
        print(f"wheelhouse: error: {err}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "requirements.txt").write_text("\n".join(download) + "\n")
    (args.out / "from-index.txt").write_text("".join(f"{r}\n" for r in from_index))
    return 0


if __name__ == "__main__":
    sys.exit(main())
