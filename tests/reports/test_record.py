"""The typed record: round trip, upgrade of schemas 1 and 2, and errors that name the field."""

import json
from pathlib import Path

import pytest

from arms.spec import CellSpec
from reports.record import SCHEMA, Record, RecordError, Spec, section, upgrade

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
            # XLA's schema-1/2 count was not loop-aware: dropped, never carried over low.
            assert record.cost.compiled_flops_per_step is None
            assert record.cost.calls_per_step == raw["flops"]["calls_per_step"]
            assert all("not loop-aware" in why for why in record.cost.unavailable.values())
            assert record.parity.data_digest == raw["parity"]["data_fingerprint"]
        again = Record.from_json(json.loads(json.dumps(record.to_json())))
        assert again == record


def test_a_cell_spec_with_ragged_counts_is_a_valid_spec_section():
    spec = CellSpec(preset="tiny", batch=8, ga=4, ragged=(64, 16, 40, 8))
    assert section(Spec, spec.to_dict()).ragged == [64, 16, 40, 8]


def test_our_decoders_options_are_spec_fields_and_name_the_cell_apart():
    """A cell run with a kernel or chunked logits reads back, and is named apart from the
    same shape run the plain way (their records hash apart too)."""
    from reports.record import cell_name

    plain = section(Spec, CellSpec(preset="tiny", seq=1024).to_dict())
    kernel = section(Spec, CellSpec(preset="tiny", seq=1024, attention="splash",
                                    logits_chunk=256).to_dict())
    assert (kernel.attention, kernel.attention_block_q, kernel.attention_block_kv,
            kernel.logits_chunk) == ("splash", 512, 1024, 256)
    assert (plain.attention, plain.logits_chunk) == ("xla", 0)
    # read back, a spec builds the same cell (the blocks XLA does not read at their defaults)
    assert CellSpec.from_dict(plain.__dict__) == CellSpec(preset="tiny", seq=1024)
    assert CellSpec.from_dict(kernel.__dict__).to_dict() == CellSpec(
        preset="tiny", seq=1024, attention="splash", logits_chunk=256).to_dict()
    assert cell_name("engine", plain) == "engine tiny seq=1024 batch=8 ga=1"
    assert cell_name("engine", kernel) == ("engine tiny seq=1024 batch=8 ga=1 "
                                           "attention=splash/512x1024 logits_chunk=256")


@pytest.mark.parametrize(("change", "message"), [
    (lambda r: r["timing"].pop("steps"), "missing field 'timing.steps'"),
    (lambda r: r["timing"]["stats"].update(cv="high"), "field 'timing.stats.cv': expected float"),
    (lambda r: r["run"].update(steps=True), "field 'run.steps': expected int"),
    (lambda r: r.update(colour="red"), "unknown field 'colour'"),
    (lambda r: r.update(schema=99), "schema 99, this version reads 1-14"),
    # Records that pass the schema but that no writer produces (an impossible result).
    (lambda r: r.update(status="weird"), "field 'status': 'weird' is neither"),
    (lambda r: r.update(timing=None), "field 'timing': an ok record holds its timing"),
    (lambda r: r["timing"].update(step_ms=[]), "field 'timing.step_ms': an ok record has"),
    (lambda r: r["timing"].update(step_ms=[1.0, float("nan")]),
     r"field 'timing.step_ms\[1\]': nan is not a finite time"),
    (lambda r: r.update(status="failed", error=None), "field 'error': a failed record says"),
    (lambda r: r["run"].update(plan_target="tpu7x:2x2x1"), "field 'plan': an ok plan record"),
])
def test_a_bad_record_names_where_and_the_field(change, message):
    raw = Record.from_json(_v1_lines()[0]).to_json()
    change(raw)
    with pytest.raises(RecordError, match=rf"r.jsonl:7: .*{message}"):
        Record.from_json(raw, "r.jsonl:7")


def test_schema_3_reads_as_a_record_that_is_not_a_plan():
    raw = Record.from_json(_v1_lines()[0]).to_json()
    for key in ("plan_target", "plan_slices", "plan_libtpu"):
        raw["run"].pop(key)
    raw.pop("plan")
    raw["schema"] = 3
    record = Record.from_json(raw)
    assert record.schema == SCHEMA == 14
    assert record.plan is None and record.run.plan_target is None


def test_schema_6_planned_bytes_of_a_step_of_several_executables_are_dropped_as_unknown():
    """Before schema 7 a split step's planned bytes left out the state held beside its
    fwd/bwd (they read low): they become unknown, with the reason; a step of one
    executable, which takes the whole state, keeps its figure."""
    lines = _v1_lines()
    split = Record.from_json(lines[0]).to_json()  # the engine: fwd_bwd + update
    single = Record.from_json(lines[1]).to_json()  # native: one step
    for raw in (split, single):
        raw["schema"] = 6
        raw["memory"]["planned_bytes"] = 12345
        for executable in raw["memory"]["executables"].values():
            executable.pop("held")
    assert len(split["memory"]["executables"]) == 2 and len(single["memory"]["executables"]) == 1
    split, single = Record.from_json(split).memory, Record.from_json(single).memory
    assert split.planned_bytes is None and "schema < 7" in split.planned_unavailable
    assert single.planned_bytes == 12345 and single.planned_unavailable is None
    assert split.executables["fwd_bwd"].held is None


def test_schema_2_moves_the_ab_round_to_the_record():
    raw = Record.from_json(_v1_lines()[0]).to_json()
    raw.update(schema=2, round=None, ab={"side": "B", "sha": "f" * 40, "round": 3})
    del raw["round"]
    cost = raw["cost"]
    raw["cost"] = {"flops_per_step": 5.0, "flops_per_s": 1.0, "mfu_vs_bf16_peak": None,
                   "flops_per_executable": {"step": 5.0}, "calls_per_step": {"step": 1},
                   "bytes_accessed_per_step": 7.0,
                   "bytes_accessed_per_executable": {"step": 7.0}}
    assert cost is not None
    record = Record.from_json(raw)
    assert record.round == 3 and record.ab.side == "B"
    assert record.cost.compiled_flops_per_step is None
    assert record.cost.bytes_accessed_per_step is None
    assert record.cost.unavailable == {"step": "schema-2 record: XLA's count was not loop-aware"}


def test_cell_key_ignores_dict_order_and_the_git_sha():
    raw = Record.from_json(_v1_lines()[0]).to_json()
    record = Record.from_json(raw)
    other = Record.from_json(json.loads(json.dumps(raw)))
    other.environment.versions = dict(reversed(other.environment.versions.items()))
    other.environment.git_sha = "0" * 40
    assert list(other.environment.versions) != list(record.environment.versions)
    assert other.cell_key() == record.cell_key()
    other.environment.versions["jax"] = "0.0.1"
    assert other.cell_key() != record.cell_key()


def test_the_host_allocator_keys_timed_records_but_not_plans():
    """A timed cell's allocator changes its timings (harness.system.allocator.HOST_MALLOC); a
    plan is the compiler's output, the same whatever malloc the host compiled it with."""
    from tests.reports.site import synthetic

    records = synthetic.nightly_history(nights=1, arms=("native",), presets=("qwen3-8b",),
                                        gas=(1,), seed=0, steps=4)
    plan = next(r for r in records if r.run.plan_target)
    timed = next(r for r in records if not r.run.plan_target)
    for record in (plan, timed):
        other = Record.from_json(record.to_json())
        other.environment.host_malloc = "MALLOC_ARENA_MAX=1"
        assert other.environment.host_malloc != record.environment.host_malloc
        assert (other.cell_key() == record.cell_key()) == (record is plan)


def test_schema_7_reads_with_no_reason_for_an_unchecked_parity():
    raw = Record.from_json(_v1_lines()[0]).to_json()
    raw.pop("parity_not_checked")
    raw["schema"] = 7
    record = Record.from_json(raw)
    assert record.schema == SCHEMA and record.parity_not_checked is None
    assert not record.unavailable and not record.is_plan


def test_a_checked_run_before_schema_11_timed_the_capture_and_is_not_compared_with_one_after():
    """Until schema 11 a checked cell's timed step carried the gradient capture (1-2% of a
    step on the chip): such a record reads `run.capture` and keys apart from today's records
    of the same cell, checked or not; an unchecked one of then keys with them. A schema-10
    plan of the program with the capture (`run.plan_capture`) reads `run.capture` too."""
    then = Record.from_json(_v1_lines()[0])  # schema 1, checked
    assert then.run.parity and then.run.capture
    now = then.to_json()
    now["run"]["capture"] = False
    checked_then = dict(now, schema=9, run=dict(now["run"]))
    checked_then["run"].pop("capture")
    unchecked_then = dict(checked_then, run=dict(checked_then["run"], parity=False))
    unchecked_now = dict(now, run=dict(now["run"], parity=False))
    keys = {name: Record.from_json(raw).cell_key() for name, raw in (
        ("now", now), ("checked then", checked_then), ("unchecked then", unchecked_then),
        ("unchecked now", unchecked_now))}
    assert Record.from_json(checked_then).run.capture
    assert keys["checked then"] != keys["now"] == keys["unchecked now"] == keys["unchecked then"]
    plan = dict(now, schema=10, run=dict(now["run"], plan_target="v5e:1x1", plan_capture=True))
    plan["run"].pop("capture")
    assert upgrade(plan)["run"]["capture"]
    assert "capture" not in upgrade(dict(plan, run=dict(plan["run"], plan_capture=False)))["run"]


def test_a_record_of_schema_11_names_no_tree_of_its_files():
    """Schema 12 added the tree id of the files that ran: a record written before reads
    with none (unknown, not HEAD's), its commit and dirtiness as recorded."""
    raw = Record.from_json(_v1_lines()[0]).to_json()
    raw["environment"].pop("git_tree")
    raw["schema"] = 11
    record = Record.from_json(raw)
    assert record.schema == SCHEMA and record.environment.git_tree is None
    assert record.environment.git_sha == raw["environment"]["git_sha"]
