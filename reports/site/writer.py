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
import multiprocessing
import os
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from reports import stats
from reports.record import Record
from reports.site import assets, pages
from reports.site.history import CellHistory, CellId, by_cell, cell_history, slim

MARKER = ".parity-site"
"""The file naming a directory as a site `publish` wrote (it may replace it)."""


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


def _jobs(records: Sequence[Record], threshold: float | None,
          thresholds: Mapping[str, float] | None) -> list[tuple[CellId, list[Record], float]]:
    """(cell, its records, the threshold it is judged at) of every cell: its suite's where
    `thresholds` names it (suite name -> relative slowdown), else `threshold`, else its
    backend's minimum effect (reports.stats.default_min_effect), as the nightly's."""
    thresholds = thresholds or {}
    jobs = []
    for cid, group in by_cell(records).items():
        suite = next((r.suite for r in group if r.suite), None)
        found = thresholds.get(suite, threshold)
        jobs.append((cid, group,
                     stats.default_min_effect(cid.backend) if found is None else found))
    return jobs


def build(records: Sequence[Record], *, threshold: float | None = None,
          thresholds: Mapping[str, float] | None = None) -> list[CellHistory]:
    """Every cell's judged history, in full (see `_jobs` for the thresholds)."""
    return [cell_history(cid, group, threshold=t)
            for cid, group, t in _jobs(records, threshold, thresholds)]


_FORKED: tuple[list, Path] | None = None
"""The jobs and the staging directory while `_cells` runs: forked workers inherit them, so
no record is sent to a worker."""


def _cell(index: int) -> CellHistory:
    """Judges one cell's runs and writes its page; returns its slim history (for the index
    and the shape pages)."""
    jobs, directory = _FORKED
    cid, group, threshold = jobs[index]
    history = cell_history(cid, group, threshold=threshold)
    (directory / pages.cell_href(history)).write_text(pages.cell(history), "utf-8")
    return slim(history)


def _worker_signals() -> None:
    """A worker leaves stops to its parent: it ignores Ctrl-C (sent to the whole process
    group; the parent ends the pool) and dies quietly of SIGTERM and SIGHUP, whatever
    handlers it inherited."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _cells(jobs: list, directory: Path, workers: int) -> list[CellHistory]:
    """`_cell` of every job, in `workers` processes forked from this one where there is more
    than one cell and this process runs no other Python thread; else here, one after the
    other.

    A fork copies only the calling thread, so a lock another thread held stays locked in the
    child. The children run Python and numpy alone: the native threads numpy's BLAS starts
    at import (which make Python warn about any fork) reset themselves across a fork, and a
    process with Python threads of its own is not forked. Callers that imported more (the
    nightly's process has JAX) pass workers=1."""
    global _FORKED
    _FORKED = (jobs, directory)
    try:
        if workers > 1 and len(jobs) > 1 and threading.active_count() == 1:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "This process .* is multi-threaded",
                                        DeprecationWarning)
                pool = multiprocessing.get_context("fork").Pool(
                    min(workers, len(jobs)), initializer=_worker_signals)
            try:
                histories = pool.map(_cell, range(len(jobs)), chunksize=1)
            except BaseException:
                pool.terminate()  # a stop or a failure: the workers end now, unfinished
                raise
            pool.close()
            pool.join()
            return histories
        return [_cell(i) for i in range(len(jobs))]
    finally:
        _FORKED = None


def render(jobs: list, directory: Path, *, source: str, workers: int) -> tuple[int, list]:
    """Writes the site's files into `directory` (which exists): assets, every cell's page
    (judged in `workers` processes), the shape pages and the index. Returns index.html's
    size and the cells' slim histories."""
    assets.write(directory / "assets")
    (directory / "cells").mkdir()
    (directory / "shapes").mkdir()
    histories = _cells(jobs, directory, workers)
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
    return len(text.encode()), histories


def publish(records: Sequence[Record], site: Path, *, source: str = "",
            threshold: float | None = None,
            thresholds: Mapping[str, float] | None = None,
            workers: int | None = None, flag: str = "-o") -> Published:
    """Judges every run of `records` and writes the site to `site`, whole or not at all;
    `workers` processes judge the cells (default: one per CPU this process may use). `flag`
    names `site` in errors (the option the user gave it with)."""
    start = time.perf_counter()
    site = Path(site)
    check_output(site, flag)
    if not records:
        raise ValueError("no records to publish")
    jobs = _jobs(records, threshold, thresholds)
    if not jobs:
        raise ValueError("no record names a cell (an arm and its spec); nothing to publish")
    workers = workers or len(os.sched_getaffinity(0))
    created = _make_parents(site.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{site.name}.publish-", dir=site.parent))
    try:
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would hide the site from a web server
        index_bytes, histories = render(jobs, staging, source=source, workers=workers)
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
