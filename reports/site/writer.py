"""`parity publish`: a nightly history as a static site, written whole or not at all.

The site is staged in a temp directory beside SITE and renamed into place: a reader (or a
web server) sees the old site or the whole new one, and a failure leaves the old site as it
was. SITE/.parity-site marks a directory this wrote, so that an existing directory of
anything else is never replaced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from reports.record import Record
from reports.site import assets, pages
from reports.site.history import CellHistory, by_cell, cell_history

MARKER = ".parity-site"
"""The file naming a directory as a site `publish` wrote (it may replace it)."""
DEFAULT_THRESHOLD = 0.05
"""The nightly's default relative slowdown (harness.cli.Nightly)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Published:
    """What a publish wrote."""

    site: Path
    """The site directory."""
    cells: int
    """Cells (index rows and cell pages)."""
    runs: int
    """Runs judged (timed and plan) over every cell."""
    shapes: int
    """Shape pages (arms side by side)."""
    index_bytes: int
    """Size of index.html."""
    seconds: float
    """Wall time of the publish (judging, rendering, writing)."""


def check_output(site: Path, flag: str = "-o") -> None:
    """Raises ValueError unless `site` can be written: absent (its nearest existing parent a
    writable directory), an empty directory, or a site this wrote before."""
    site = Path(site)
    if site.exists() and not site.is_dir():
        raise ValueError(f"{flag} {site} is a file; give a directory for the site")
    if site.is_dir() and any(site.iterdir()) and not (site / MARKER).is_file():
        raise ValueError(f"{flag} {site} is a directory parity publish did not write (no "
                         f"{MARKER} in it); give a new or empty directory")
    existing = site if site.exists() else site.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {site}: {existing} is a file; give a directory")
    try:  # a probe file, removed at once: where it cannot be made, neither can the site
        with tempfile.TemporaryFile(dir=existing, prefix=".parity-probe-"):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {site}: cannot write in {existing} "
                         f"({err.strerror or err}); give a writable directory") from None


def build(records: Sequence[Record], *, threshold: float = DEFAULT_THRESHOLD,
          thresholds: Mapping[str, float] | None = None) -> list[CellHistory]:
    """Every cell's judged history. A cell is judged at its suite's threshold where
    `thresholds` names it (suite name -> relative slowdown), else at `threshold`."""
    thresholds = thresholds or {}
    histories = []
    for cid, group in by_cell(records).items():
        suite = next((r.suite for r in group if r.suite), None)
        histories.append(cell_history(cid, group, threshold=thresholds.get(suite, threshold)))
    return histories


def render(histories: Sequence[CellHistory], directory: Path, *, source: str) -> int:
    """Writes the site's files into `directory` (which exists); returns index.html's size."""
    assets.write(directory / "assets")
    (directory / "cells").mkdir()
    (directory / "shapes").mkdir()
    for history in histories:
        (directory / pages.cell_href(history)).write_text(pages.cell(history), "utf-8")
    by_shape: dict[tuple, list[CellHistory]] = {}
    for history in histories:
        by_shape.setdefault(history.id.shape, []).append(history)
    for key, group in by_shape.items():
        (directory / pages.shape_href(key)).write_text(pages.shape(key, group), "utf-8")
    generated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    text = pages.index(histories, source=source, generated=generated)
    (directory / "index.html").write_text(text, "utf-8")
    (directory / MARKER).write_text("written by parity publish; it may replace this "
                                    "directory whole\n")
    return len(text.encode())


def publish(records: Sequence[Record], site: Path, *, source: str = "",
            threshold: float = DEFAULT_THRESHOLD,
            thresholds: Mapping[str, float] | None = None) -> Published:
    """Judges every run of `records` and writes the site to `site`, whole or not at all."""
    start = time.perf_counter()
    site = Path(site)
    check_output(site)
    if not records:
        raise ValueError("no records to publish")
    histories = build(records, threshold=threshold, thresholds=thresholds)
    if not histories:
        raise ValueError("no record names a cell (an arm and its spec); nothing to publish")
    created = _make_parents(site.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{site.name}.publish-", dir=site.parent))
    try:
        index_bytes = render(histories, staging, source=source)
        _swap(staging, site)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for directory in created:
            _rmdir_quietly(directory)
        raise
    return Published(site=site, cells=len(histories),
                     runs=sum(len(h.timed) + len(h.plans) for h in histories),
                     shapes=len({h.id.shape for h in histories}), index_bytes=index_bytes,
                     seconds=time.perf_counter() - start)


def _make_parents(directory: Path) -> list[Path]:
    """Creates `directory` and its missing parents; returns those it created, deepest first."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir()
    return missing


def _rmdir_quietly(directory: Path) -> None:
    with contextlib.suppress(OSError):  # not empty: someone else wrote there meanwhile
        directory.rmdir()


def _swap(staging: Path, site: Path) -> None:
    """Moves the staged site to `site`: renamed into place, an old site first renamed aside
    and removed once the new one is there (renamed back should the second rename fail)."""
    if not site.exists():
        staging.rename(site)
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{site.name}.old-", dir=site.parent))
    aside.rmdir()  # a fresh name in the same directory; rename needs it absent
    site.rename(aside)
    try:
        staging.rename(site)
    except BaseException:
        aside.rename(site)
        raise
    shutil.rmtree(aside, ignore_errors=True)
