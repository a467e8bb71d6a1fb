"""The results files: one JSON record per line (reports.record.codec), appended whole or not
at all, by one writer at a time; and the checks that a run can write where it is asked to,
made before anything runs."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.system.reaper import REAPER
from reports.record import Record, codec


class WriteError(RuntimeError):
    """A record could not be written; the results file is as it was before the write."""


def append(path: str | Path, record: Record) -> None:
    """Appends one record as one line, whole or not at all, then fsyncs.

    The line goes out in one O_APPEND write. If that write is short or fails (a full disk),
    or the fsync fails, the file is truncated back to its length before the write and
    `WriteError` says so: no reader ever meets half a record, and the next append does not
    glue a good record onto a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = codec.encode_line(record)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        if before and os.pread(fd, 1, before - 1) != b"\n":
            raise WriteError(f"{path} ends in a partial line (byte {before}): it was not "
                             "written by this version, or by a process killed mid-write; "
                             "nothing was appended. Check it with `parity report`")
        try:
            written = os.write(fd, line)
            if written != len(line):
                raise OSError(errno.ENOSPC, f"short write: {written} of {len(line)} bytes")
            os.fsync(fd)
        except OSError as err:
            os.ftruncate(fd, before)
            raise WriteError(f"could not write a record to {path} ({err.strerror or err}); "
                             f"the file is back to its {before} bytes of whole records") from err
    finally:
        os.close(fd)


def write_whole(path: str | Path, data: bytes) -> None:
    """`data` as the file `path`, whole, by rename from a file of this process's own beside
    it: a reader sees the file before, the file after or none, never a part of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    partial.replace(path)


def check_appendable(path: Path) -> None:
    """Raises ValueError unless records can be appended to `path` (absent, or whole lines
    that read back as records)."""
    if not path.exists():
        return
    codec.read(path)  # names the file, line and field of anything unreadable (a directory)
    try:  # opening for append writes nothing; it fails where a write would
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
    except OSError as err:
        raise ValueError(f"{path}: cannot append to it ({err.strerror or err}); make it "
                         "writable, or give another --run-id or --out") from None
    try:
        size = os.fstat(fd).st_size
        last = os.pread(fd, 1, size - 1) if size else b"\n"
    finally:
        os.close(fd)
    if last != b"\n":
        raise ValueError(f"{path} ends in a partial line; give another --run-id, or remove "
                         "that line")


def check_writable(directory: Path, flag: str = "--out") -> None:
    """Raises ValueError unless files can be created in `directory` (or in the directory
    that would hold it). A probe file is created and removed; nothing else is written."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"{flag} {directory} is a file; give a directory")
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ValueError(f"{flag} {directory}: {existing} is a file; give a directory")
    try:
        with tempfile.TemporaryFile(dir=existing, prefix=".parity-probe-"):
            pass
    except OSError as err:
        raise ValueError(f"{flag} {directory}: cannot write in {existing} "
                         f"({err.strerror or err}); give a writable directory") from None


@contextlib.contextmanager
def exclusive(path: Path) -> Iterator[None]:
    """Holds the lock of results file `path` (a hidden `.NAME.lock` beside it): a second
    writer of the same file fails at once, naming the process that holds it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lock_path = path.with_name(f".{path.name}.lock")
    while True:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise ValueError(f"{path} is being written by another parity process (pid "
                             f"{holder}); wait for it, or give another --run-id") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a lock file its last holder removed while we waited for it
            break
        os.close(fd)
    try:
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as err:  # e.g. a full disk: the lock is the first byte a run writes
            raise WriteError(f"cannot write {lock_path} ({err.strerror or err}); no cell was "
                             "run and no record written: free space there, or give another "
                             "--out") from None
        with REAPER.watch("path", path=str(lock_path)):  # removed even if we are killed
            yield
    finally:
        os.unlink(lock_path)
        os.close(fd)
