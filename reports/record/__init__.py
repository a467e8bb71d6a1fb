"""The results record: what one cell's line in a results file holds, and how it is read.

A record is one cell (an arm given one spec of work) measured, or planned, in one process.
Writers build a `Record` and store it with `codec.encode_line`; readers get records back with
`read`/`read_dir` (or `Record.from_json` from JSON data) and use their attributes. Data of any
schema version this reader knows is upgraded to the current layout (`SCHEMA`) first; input
that is not a record raises `RecordError` naming the file, line and field.

The package imports nothing but the standard library, so anything that writes or reads
records may import it. Its modules, each importing only those listed before it:

    errors    RecordError
    versions  SCHEMA and `upgrade`: the layout's versions and how each earlier one is read
    decode    `section`: JSON data -> a section dataclass, every field checked
    plans     a plan record's sections: `Plan`, its executables, its roofline
    schema    the section dataclasses and `Record`
    names     `cell_name` and `path_safe`: a cell named for people and for file paths
    codec     the results format: `encode_line`, `read`, `read_dir`, `ResultsError`
"""

from reports.record import codec
from reports.record.codec import ResultsError, encode_line, read, read_dir
from reports.record.decode import section
from reports.record.errors import RecordError
from reports.record.names import cell_name, path_safe
from reports.record.plans import Bound, Datasheet, ExecutablePlan, Plan, Roofline
from reports.record.schema import (
    UNAVAILABLE,
    ABTag,
    Cost,
    Environment,
    ExecutableMemory,
    Failure,
    GCPauses,
    HostMemory,
    Memory,
    Parity,
    Record,
    RunOptions,
    Spec,
    StepStats,
    Timing,
    Trace,
    sliced_runs,
)
from reports.record.versions import SCHEMA, upgrade

__all__ = [
    "SCHEMA",
    "UNAVAILABLE",
    "ABTag",
    "Bound",
    "Cost",
    "Datasheet",
    "Environment",
    "ExecutableMemory",
    "ExecutablePlan",
    "Failure",
    "GCPauses",
    "HostMemory",
    "Memory",
    "Parity",
    "Plan",
    "Record",
    "RecordError",
    "ResultsError",
    "Roofline",
    "RunOptions",
    "Spec",
    "StepStats",
    "Timing",
    "Trace",
    "cell_name",
    "codec",
    "encode_line",
    "path_safe",
    "read",
    "read_dir",
    "section",
    "sliced_runs",
    "upgrade",
]
