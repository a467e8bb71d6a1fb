"""Records for the report tests: the checked-in fixture (real `parity run` output, schema 1,
read through the real upgrade) and variants of it written back as schema-3 JSON lines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from reports.record import Record

FIXTURES = Path(__file__).parent / "fixtures"
RESULTS = FIXTURES / "results.jsonl"


def fixture_records(arms: tuple[str, ...] | None = None) -> list[Record]:
    """The fixture's records (of `arms` only, when given), upgraded to the current schema."""
    records = [Record.from_json(json.loads(line), f"{RESULTS.name}:{n}")
               for n, line in enumerate(RESULTS.read_text().splitlines(), 1)]
    return [r for r in records if arms is None or r.arm in arms]


def write(records: list[Record], path: Path) -> Path:
    """The records as a results file, one JSON line each (the layout the harness appends)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in records))
    return path


def with_rounds(record: Record, median_ms: float, rounds: int = 6, steps: int = 8,
                seed: int = 0) -> list[Record]:
    """`rounds` interleaved rounds of one cell whose steps scatter 1% around `median_ms`;
    round 0 keeps the parity section, later rounds only time (as the runner does)."""
    rng = np.random.default_rng(seed)
    out = []
    for index in range(rounds):
        samples = [float(x) for x in median_ms * (1 + rng.normal(0, 0.01, steps))]
        timing = dataclasses.replace(record.timing, step_ms=samples, steps=steps)
        out.append(dataclasses.replace(record, round=index, timing=timing,
                                       parity=record.parity if index == 0 else None))
    return out
