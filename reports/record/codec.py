"""The results format: one record per line of a `.jsonl` file, as one JSON object.

A line is the record's `to_json` data with its keys sorted, then a newline. JSON has no NaN
or infinity, so a float that is not finite is written as null (the record's other fields say
why, e.g. a gradient that overflowed) and reads back as None. `encode_line` gives the bytes of
one line, for a writer to append in one write; `read` and `read_dir` turn results files back
into validated records. Input that is not such a file raises `ResultsError`, naming the file,
the line and, for a record that does not validate, the field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from reports.record.errors import RecordError
from reports.record.schema import Record

__all__ = ["ResultsError", "encode_line", "read", "read_dir"]

ResultsError = RecordError
"""A results file that cannot be read (the class `RecordError`); the message names the file,
line and field."""


def encode_line(record: Record) -> bytes:
    """The record as one results line: sorted-key JSON, non-finite floats as null, and a
    newline."""
    return (json.dumps(_finite(record.to_json()), sort_keys=True, allow_nan=False)
            + "\n").encode()


def _finite(value):
    """JSON has no NaN/inf: non-finite floats are stored as null (the cell says why)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def read(path: str | Path) -> list[Record]:
    """All records of one .jsonl file; a clear error names the file and line of bad input."""
    path = Path(path)
    records = []
    try:
        with path.open("rb") as f:
            raw = f.read()
    except IsADirectoryError:
        raise ResultsError(f"{path} is a directory, not a results file; rename or remove "
                           "it (results files are the *.jsonl files of --out)") from None
    except OSError as err:
        raise ResultsError(f"{path}: cannot read it ({err.strerror or err})") from None
    for number, blob in enumerate(raw.splitlines(), 1):
        try:
            line = blob.decode()
        except UnicodeDecodeError as err:
            raise ResultsError(f"{path}:{number}: not UTF-8 text (byte {err.start}); the file "
                               "is corrupt: delete that line or re-run") from None
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as err:
            raise ResultsError(f"{path}:{number}: not valid JSON ({err.msg}); the file is "
                               "corrupt or was cut off: delete that line or re-run") from err
        records.append(Record.from_json(data, f"{path}:{number}"))
    return records


def results_files(directory: str | Path) -> list[Path]:
    """The results files of a results directory (its *.jsonl, by name); [] where there is
    no such directory."""
    directory = Path(directory)
    return sorted(directory.glob("*.jsonl")) if directory.is_dir() else []


def read_dir(directory: str | Path) -> list[Record]:
    """Every record under a results directory (all *.jsonl, by name) or of one file."""
    directory = Path(directory)
    if directory.is_file():
        files = [directory]
    elif directory.is_dir():
        files = results_files(directory)
    else:
        raise ResultsError(f"{directory}: no such results directory or file")
    records = [r for f in files for r in read(f)]
    if not records:
        raise ResultsError(f"{directory}: no records (no non-empty *.jsonl files); run "
                           "`parity run ... --out DIR` first")
    return records
