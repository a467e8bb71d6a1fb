"""The results store: one JSON record per line, appended atomically, read back strictly."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from reports import records
from reports.record import Record


def append(path: str | Path, record: Record) -> None:
    """Appends one record as one line with a single O_APPEND write, then fsyncs.

    A reader never sees half a record from an interrupted run: the line is written whole or
    not at all (one write call on a local file), and a killed writer leaves earlier lines
    intact.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(_finite(record.to_json()), sort_keys=True, allow_nan=False)
            + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        written = os.write(fd, line)
        if written != len(line):
            raise OSError(f"short write to {path}: {written} of {len(line)} bytes")
        os.fsync(fd)
    finally:
        os.close(fd)


def _finite(value):
    """JSON has no NaN/inf: non-finite floats are stored as null (the cell says why)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# The reader lives with the reports, which read nothing but this format.
read, read_dir, ResultsError = records.read, records.read_dir, records.ResultsError
