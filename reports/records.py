"""Reading results: JSONL records -> validated dicts -> one flat pandas DataFrame.

This is the only place that parses the results format; the harness's reader is this one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

SCHEMA = 1
COMPARABLE = ("backend", "device_kind", "device_count", "process_count", "xla_flags",
              "versions")


class ResultsError(ValueError):
    """A results file that cannot be read; the message names the file and line."""


def read(path: str | Path) -> list[dict]:
    """All records of one .jsonl file; a clear error names the file and line of bad input."""
    path = Path(path)
    records = []
    with path.open() as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ResultsError(f"{path}:{number}: not valid JSON ({err.msg}); the file is "
                                   "corrupt or was cut off: delete that line or re-run") from err
            schema = record.get("schema") if isinstance(record, dict) else None
            if schema != SCHEMA:
                raise ResultsError(f"{path}:{number}: not a parity record (schema {schema!r}, "
                                   f"expected {SCHEMA})")
            records.append(record)
    return records


def read_dir(directory: str | Path) -> list[dict]:
    """Every record under a results directory (all *.jsonl, by name) or of one file."""
    directory = Path(directory)
    if directory.is_file():
        files = [directory]
    elif directory.is_dir():
        files = sorted(directory.glob("*.jsonl"))
    else:
        raise ResultsError(f"{directory}: no such results directory or file")
    records = [r for f in files for r in read(f)]
    if not records:
        raise ResultsError(f"{directory}: no records (no non-empty *.jsonl files); run "
                           "`parity run ... --out DIR` first")
    return records


def fingerprint_key(fingerprint: dict | None) -> str:
    """What must match for two records to be compared, as one readable string."""
    if not fingerprint:
        return "unknown environment"
    versions = fingerprint.get("versions") or {}
    pins = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()) if v)
    flags = fingerprint.get("xla_flags") or "none"
    return (f"{fingerprint.get('backend')} x{fingerprint.get('device_count')} "
            f"{fingerprint.get('device_kind')} / processes {fingerprint.get('process_count')}"
            f" / XLA_FLAGS {flags} / {pins}")


def _get(record: dict, *path, default=None):
    value = record
    for key in path:
        if not isinstance(value, dict) or value.get(key) is None:
            return default
        value = value[key]
    return value


def to_frame(records: list[dict]) -> pd.DataFrame:
    """One row per cell, the columns every report reads (raw samples kept as lists)."""
    rows = []
    for r in records:
        spec, ok = r.get("spec") or {}, r.get("status") == "ok"
        trace = r.get("trace") or {}
        executions = trace.get("executions_per_step")
        rows.append({
            "run_id": r.get("run_id"), "suite": r.get("suite"), "arm": r.get("arm"),
            "about": r.get("about"),
            "preset": spec.get("preset"), "seq": spec.get("seq"), "batch": spec.get("batch"),
            "ga": spec.get("ga"), "dtype": spec.get("dtype"), "mesh": spec.get("mesh") or "1",
            "loss_kind": spec.get("loss"), "ragged": tuple(spec["ragged"])
            if spec.get("ragged") else None, "config_hash": r.get("config_hash"),
            "status": r.get("status"), "error_reason": _get(r, "error", "reason"),
            "error_message": _get(r, "error", "message"),
            "fingerprint": fingerprint_key(r.get("fingerprint")),
            "git_sha": _get(r, "fingerprint", "git_sha"),
            "git_dirty": _get(r, "fingerprint", "git_dirty"),
            "steps": _get(r, "run", "steps"), "warmup": _get(r, "run", "warmup"),
            "traced_window": bool(_get(r, "run", "trace")),
            "step_ms": _get(r, "timing", "step_ms", default=[]) if ok else [],
            "median_ms": _get(r, "timing", "summary", "median_ms"),
            "mean_ms": _get(r, "timing", "summary", "mean_ms"),
            "max_ms": _get(r, "timing", "summary", "max_ms"),
            "p90_ms": _get(r, "timing", "summary", "p90_ms"),
            "cv": _get(r, "timing", "summary", "cv"),
            "tokens_per_s": _get(r, "timing", "tokens_per_s"),
            "compile_s": _get(r, "timing", "compile_s"),
            "recompiles": _get(r, "timing", "recompiles_after_warmup"),
            "gc_count": _get(r, "timing", "gc", "count"),
            "gc_ms": _get(r, "timing", "gc", "total_ms"),
            "dispatch_ms": _median(_get(r, "timing", "dispatch_ms", default=[])),
            "flops_per_step": _get(r, "flops", "per_step"),
            "mfu": _get(r, "flops", "mfu_vs_bf16_peak"),
            "peak_bytes": _get(r, "memory", "peak_bytes_in_use"),
            "planned_bytes": _get(r, "memory", "planned_bytes"),
            "rss_delta_bytes": _get(r, "memory", "rss_delta_bytes"),
            "loss": _get(r, "parity", "loss"), "exact_loss": _get(r, "parity", "exact_loss"),
            "rel_l2": _get(r, "parity", "rel_l2"), "grad_l2": _get(r, "parity", "grad_l2"),
            "denominator": _get(r, "parity", "denominator"),
            "denominators": tuple(_get(r, "parity", "denominators", default=()) or ()),
            "data_fingerprint": _get(r, "parity", "data_fingerprint"),
            "trace_executions": max(executions) if executions else None,
            "trace_step_ms": _median(trace.get("step_ms") or []),
            "trace_busy_ms": _median(trace.get("busy_ms") or []),
            "trace_host_ms": _median(trace.get("host_ms") or []),
            "xplane": trace.get("xplane"),
        })
    return pd.DataFrame(rows)


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
