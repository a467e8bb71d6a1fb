"""A plan's roofline is the arithmetic harness.measure.roofline states, on a plan whose
figures are known; the datasheets name a source for every figure they hold."""

import re

import pytest

from harness.measure.devices import DEVICES
from harness.measure.roofline import COLLECTIVES, COMPUTE, MEMORY, datasheet, roofline
from reports.record import ExecutablePlan, Plan

# TPU7x per device (half a chip): 2307/2 TFLOP/s, 7380/2 GB/s HBM, 1200/2 GB/s ICI.
PEAK, HBM, ICI = 2307e12 / 2, 7380e9 / 2, 1200e9 / 2
REL = 1e-12
"""Float64 rounding of a few divisions and sums: the arithmetic is exact otherwise."""


def _executable(calls: int, *, flops: float | None, hbm: float,
                collectives: dict[str, float]) -> ExecutablePlan:
    return ExecutablePlan(calls_per_step=calls, argument=0, output=0, alias=0, temp=0,
                          peak_memory_in_bytes=0, host_temp=0, held_bytes=0, hbm_bytes=hbm,
                          flops=flops, collective_bytes=collectives, trip_counts=[])


def _plan(executables: dict[str, ExecutablePlan], *, kind: str = "TPU7x",
          model_flops: float = 8 * 2e-3 * PEAK) -> Plan:
    return Plan(target="tpu7x:2x2x1", slices=1, device_kind=kind, device_count=8,
                libtpu="0.0.52", mesh={"fsdp": 8}, hbm_capacity_bytes=None,
                executables=executables, resident_bytes={}, planned_peak_bytes=0,
                peak_executable="fwd_bwd", xla_peak_bytes=0, hbm_bytes_per_step=None,
                flops_per_step=None, model_flops_per_step=model_flops,
                collective_bytes_per_step=None, fits=None, compile_s=0.0,
                host_peak_rss_bytes=None)


SPLIT = {
    # one call: compute 1 ms, memory 2 ms, collectives 1 + 0.5 ms -> 2 ms, memory-bound
    "fwd_bwd": _executable(4, flops=1e-3 * PEAK, hbm=2e-3 * HBM,
                           collectives={"all-gather": 1e-3 * ICI,
                                        "reduce-scatter": 0.5e-3 * ICI}),
    # one call: compute 0, memory 1 ms, all-reduce 2 ms -> 2 ms, collective-bound
    "update": _executable(1, flops=0.0, hbm=1e-3 * HBM, collectives={"all-reduce": 2e-3 * ICI}),
    # no call per step: adds nothing
    "accumulate": _executable(0, flops=1.0 * PEAK, hbm=1.0 * HBM, collectives={}),
}


def test_the_roofline_of_a_known_plan_is_the_stated_arithmetic():
    roof = roofline(_plan(SPLIT), "bfloat16")
    sheet = roof.datasheet
    assert (sheet.peak_flops, sheet.hbm_bytes_per_s, sheet.interconnect_bytes_per_s) == (
        PEAK, HBM, ICI)
    fwd = roof.executables["fwd_bwd"]
    assert fwd.compute_s == pytest.approx(1e-3, rel=REL)
    assert fwd.memory_s == pytest.approx(2e-3, rel=REL)
    assert fwd.collective_s == pytest.approx({"all-gather": 1e-3, "reduce-scatter": 0.5e-3},
                                             rel=REL)
    assert fwd.lower_bound_s == pytest.approx(2e-3, rel=REL) and fwd.bound_by == MEMORY
    update = roof.executables["update"]
    assert update.lower_bound_s == pytest.approx(2e-3, rel=REL)
    assert update.bound_by == COLLECTIVES
    step = roof.step
    assert step.compute_s == pytest.approx(4e-3, rel=REL)
    assert step.memory_s == pytest.approx(4 * 2e-3 + 1e-3, rel=REL)
    assert step.collective_s == pytest.approx(
        {"all-gather": 4e-3, "reduce-scatter": 2e-3, "all-reduce": 2e-3}, rel=REL)
    # executables run one after another: 4 x 2 ms (memory) + 1 x 2 ms (collectives)
    assert step.lower_bound_s == pytest.approx(10e-3, rel=REL) and step.bound_by == MEMORY
    assert roof.model_compute_s == pytest.approx(2e-3, rel=REL)  # 8 devices share the model
    assert roof.mfu_ceiling == pytest.approx(0.2, rel=REL)


def test_compute_bound_and_a_float32_plan_use_the_tpus_one_pass_peak():
    plan = _plan({"step": _executable(1, flops=3e-3 * PEAK, hbm=1e-3 * HBM,
                                      collectives={"all-gather": 1e-3 * ICI})})
    for dtype in ("bfloat16", "float32"):  # JAX's default precision: one bf16 MXU pass
        roof = roofline(plan, dtype)
        assert roof.step.bound_by == COMPUTE
        assert roof.step.lower_bound_s == pytest.approx(3e-3, rel=REL)
        assert roof.mfu_ceiling == pytest.approx(2 / 3, rel=REL)


def test_what_is_unknown_gives_no_bound_and_no_datasheet_no_roofline():
    unknown = _plan({"step": _executable(1, flops=None, hbm=HBM, collectives={})})
    roof = roofline(unknown, "bfloat16")
    assert roof.step.lower_bound_s is None and roof.mfu_ceiling is None
    assert roof.executables["step"].memory_s == pytest.approx(1.0, rel=REL)
    assert roofline(_plan(SPLIT, kind="cpu"), "bfloat16") is None
    # TPU v4's docs page gives no per-chip ICI figure: collectives cannot be bounded
    v4 = roofline(_plan(SPLIT, kind="TPU v4"), "bfloat16")
    assert v4.executables["fwd_bwd"].collective_s is None and v4.step.lower_bound_s is None
    assert datasheet("NVIDIA B200", "float32") is None  # no TF32 figure kept for it


def _figures(text: str) -> set[float]:
    return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)}


def test_every_datasheet_figure_is_in_its_source():
    """Each kind's peak, HBM bandwidth and interconnect bandwidth, per chip in the vendor's
    unit (TFLOP/s or PFLOP/s, GB/s or TB/s), appear in the source it names."""
    for kind, spec in DEVICES.items():
        found = _figures(spec.source)
        per_chip = spec.devices_per_chip
        assert {spec.bf16_flops * per_chip / 1e12, spec.bf16_flops * per_chip / 1e15} & found, kind
        assert {spec.hbm_bytes_per_s * per_chip / 1e9,
                spec.hbm_bytes_per_s * per_chip / 1e12} & found, kind
        if spec.interconnect_bytes_per_s is not None:
            assert {round(spec.interconnect_bytes_per_s * per_chip / 1e9, 6),
                    round(spec.interconnect_bytes_per_s * per_chip / 1e12, 6)} & found, kind
        else:
            assert "ICI" in spec.source or "interconnect" in spec.source, kind
