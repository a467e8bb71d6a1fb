"""The commands that open a traced cell's capture in a profile viewer, from its record alone.

A traced record's `trace.logdir` is the directory its capture was written to
('<trace root>/<run id>/<cell>', holding `plugins/profile/<timestamp>/<host>.xplane.pb`).
Both viewers take that directory as `--logdir`: xprof (standalone, http://localhost:8791 by
default) and TensorBoard with its profile plugin (`tensorboard-plugin-profile`, which is
xprof's plugin; http://localhost:6006). Both list the same tools; memory_viewer and
graph_viewer only for a capture taken with `--trace-hlo` (`run.trace_hlo` in the record).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from reports.record import Record, cell_name

XPROF_PORT = 8791
"""xprof's own default port, spelled out so the printed command says where to browse."""

VIEWERS = ("xprof", "tensorboard")


def viewer_commands(logdir: str, port: int = XPROF_PORT) -> dict[str, str]:
    """{'xprof': 'xprof --logdir DIR --port PORT', 'tensorboard': 'tensorboard --logdir DIR'}:
    shell commands serving `logdir` (quoted where the shell needs it)."""
    directory = shlex.quote(str(logdir))
    return {"xprof": f"xprof --logdir {directory} --port {port}",
            "tensorboard": f"tensorboard --logdir {directory}"}


def trace_commands(record: Record, port: int = XPROF_PORT) -> dict[str, str] | None:
    """`viewer_commands` of the record's capture; None for a record without a trace."""
    if record.trace is None:
        return None
    return viewer_commands(record.trace.logdir, port)


def hint(records: Iterable[Record], port: int = XPROF_PORT) -> str:
    """What `parity run` prints after a run: per traced cell, its name and both commands;
    '' when no record has a trace."""
    traced = [r for r in records if r.trace is not None]
    if not traced:
        return ""
    lines = [f"traces: serve a cell's capture with either command, then browse "
             f"http://localhost:{port} (xprof) or http://localhost:6006 (tensorboard)"]
    if not all(r.run and r.run.trace_hlo for r in traced):
        lines.append("  (memory_viewer and graph_viewer need a capture taken with --trace-hlo)")
    for record in traced:
        commands = trace_commands(record, port)
        lines.append(f"  {cell_name(record.arm, record.spec)}:")
        lines.extend(f"    {commands[viewer]}" for viewer in VIEWERS)
    return "\n".join(lines)
