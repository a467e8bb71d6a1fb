"""The typed record: round trip, upgrade of schema 1, and errors that name the field."""

import json
from pathlib import Path

import pytest

from arms.spec import CellSpec
from reports.record import SCHEMA, Record, RecordError, Spec, section

FIXTURE = Path(__file__).parent / "fixtures" / "results.jsonl"


def _v1_lines():
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def test_schema_1_upgrades_and_round_trips_through_the_current_schema():
    for number, raw in enumerate(_v1_lines(), 1):
        assert raw["schema"] == 1
        record = Record.from_json(raw, f"results.jsonl:{number}")
        assert record.schema == SCHEMA
        assert record.environment.backend == raw["fingerprint"]["backend"]
        if record.ok:
            assert record.timing.stats.median_ms == raw["timing"]["summary"]["median_ms"]
            assert record.cost.flops_per_step == raw["flops"]["per_step"]
            assert record.parity.data_digest == raw["parity"]["data_fingerprint"]
        again = Record.from_json(json.loads(json.dumps(record.to_json())))
        assert again == record


def test_a_cell_spec_with_ragged_counts_is_a_valid_spec_section():
    spec = CellSpec(preset="tiny", batch=8, ga=4, ragged=(64, 16, 40, 8))
    assert section(Spec, spec.to_dict()).ragged == [64, 16, 40, 8]


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["timing"].pop("steps"), "missing field 'timing.steps'"),
    (lambda r: r["timing"]["stats"].update(cv="high"), "field 'timing.stats.cv': expected float"),
    (lambda r: r["run"].update(steps=True), "field 'run.steps': expected int"),
    (lambda r: r.update(colour="red"), "unknown field 'colour'"),
    (lambda r: r.update(schema=99), "schema 99, this version reads 1-2"),
])
def test_a_bad_record_names_where_and_the_field(change, message):
    raw = Record.from_json(_v1_lines()[0]).to_json()
    change(raw)
    with pytest.raises(RecordError, match=rf"r.jsonl:7: .*{message}"):
        Record.from_json(raw, "r.jsonl:7")
