"""Different work, by compiled FLOPs per model FLOP: told apart at 5%, shown in the summary,
the timing table and the per-cell line, and never given a speedup verdict."""

import dataclasses

import pytest

from harness.cli.console import cell_line
from reports.frame import to_frame
from reports.record import Cost
from reports.summary import summary
from reports.tables import timing
from reports.work import WORK_TOLERANCE, different_work, flops_per_model_flop, record_ratio
from tests.reports.helpers import fixture_records, with_rounds

MODEL_FLOPS = 1e9


def _costed(record, ratio):
    """`record` with a cost section whose compiled FLOPs are `ratio` x its model FLOPs."""
    cost = Cost(model_flops_per_step=MODEL_FLOPS, model_flops_per_s=None,
                mfu_vs_bf16_peak=None, compiled_flops_per_step=ratio * MODEL_FLOPS,
                bytes_accessed_per_step=None, calls_per_step={"step": 1},
                compiled_flops_per_executable={"step": ratio * MODEL_FLOPS},
                bytes_accessed_per_executable={"step": None}, loop_trip_counts={})
    return dataclasses.replace(record, cost=cost)


def _rounds(medians, ratios):
    """Six interleaved rounds of the fixture's s16 ga1 cells (all pass parity), at the given
    medians and compiled/model FLOPs."""
    out = []
    for record in fixture_records(tuple(medians)):
        if record.ok and record.spec.seq == 16 and record.spec.ga == 1:
            out += with_rounds(_costed(record, ratios[record.arm]), medians[record.arm],
                               seed=len(out))
    return out


def test_ratios_apart_by_more_than_the_tolerance_are_different_work():
    assert different_work(1.25, 1.04) == "different work (compiled/model FLOPs 1.25 vs 1.04)"
    assert different_work(1.04, 1.25) == "different work (compiled/model FLOPs 1.04 vs 1.25)"
    assert different_work(1.04, 1.04 * (1 + WORK_TOLERANCE) - 1e-9) == ""
    assert different_work(1.04, 1.04 * (1 + WORK_TOLERANCE) + 1e-6) != ""
    assert different_work(None, 1.04) == "" and different_work(1.04, None) == ""
    assert flops_per_model_flop(2.6e8, 1e9, 4) == pytest.approx(1.04)
    assert flops_per_model_flop(None, 1e9, 4) is None  # a loop of unknown length
    assert flops_per_model_flop(float("nan"), 1e9, 4) is None


def test_different_work_gets_no_verdict_and_is_never_the_fastest():
    # engine is 2x faster than native by the clock, but recomputes a quarter more.
    frame = to_frame(_rounds({"native": 4.0, "engine": 2.0, "peft-decoder": 8.0},
                             {"native": 1.04, "engine": 1.30, "peft-decoder": 1.05}))
    text = summary(frame, "native")
    timed = text[text.index("**Timing**"):]
    engine = next(line for line in timed.splitlines() if "| engine |" in line)
    assert "different work (compiled/model FLOPs 1.30 vs 1.04); not comparable work" in engine
    assert "faster" not in engine  # no verdict, however clear the clock is
    assert "| **native** (fastest) |" in text
    assert ("engine has a lower median (2.0 ms) than native but does different work "
            "(compiled/model FLOPs 1.30 vs 1.04), so it is not the fastest") in text
    peft = next(line for line in timed.splitlines() if "| peft-decoder |" in line)
    assert "| slower |" in peft and "different work" not in peft  # 1.05 vs 1.04: same work
    table = timing(frame, "native")
    assert "different work (compiled/model FLOPs 1.30 vs 1.04); not comparable work" in table


def test_the_cell_line_names_the_arm_whose_work_differs():
    records = _rounds({"native": 4.0, "engine": 2.0}, {"native": 1.04, "engine": 1.30})
    native = next(r for r in records if r.arm == "native")
    engine = next(r for r in records if r.arm == "engine")
    assert record_ratio(engine) == pytest.approx(1.30)
    line = cell_line(engine, [native])
    assert line.endswith("; different work (compiled/model FLOPs 1.30 vs 1.04 of native): its "
                         "time is not comparable work")
    assert "different work" not in cell_line(engine, [])  # nothing to compare with yet
    assert "different work" not in cell_line(native, [_costed(native, 1.06)])
