"""harness.xla (hlo, counts) on programs compiled for TPU7x (libtpu, compile-only devices), each
count checked against the program's own arithmetic, exactly: these are integers of the
compiler's program, not measurements."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from harness.xla import hlo

REPO = pathlib.Path(__file__).parents[3]


@pytest.fixture(scope="module")
def counted():
    """The counts of tests/harness/xla/programs.py, from a process of its own (libtpu)."""
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-m", "tests.harness.xla.programs"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_matmul_moves_its_operands_and_result_once_and_does_2mnk_flops(counted):
    matmul = counted["matmul"]
    assert matmul["flops"] == matmul["expected_flops"] == matmul["xla_flops"]
    assert matmul["hbm"] == matmul["io_bytes"]
    assert not any(matmul["collectives"].values())


def test_a_scanned_loop_is_counted_as_many_times_as_it_runs(counted):
    """XLA:TPU annotates no trip count and costs a loop body once (its own FLOPs are one
    layer's); the count reads the trip count off the loop and multiplies."""
    scanned = counted["scanned"]
    assert scanned["trips"] == [scanned["layers"]]
    assert scanned["flops"] == scanned["expected_flops"]
    assert scanned["xla_flops"] * scanned["layers"] == pytest.approx(scanned["flops"])
    # Each iteration reads one layer of the stacked weights: the stack is read once over
    # the loop (counting the whole stack per iteration would give layers x it).
    assert scanned["stack_bytes"] < scanned["hbm"] < 2 * scanned["stack_bytes"]


def test_collectives_are_counted_by_kind_as_the_bytes_each_device_sends(counted):
    """Over 8 devices a ring all-gather sends 7/8 of the gathered buffer from each device;
    an all-reduce twice that of its operand (a reduce-scatter, then an all-gather)."""
    gather, reduce = counted["gather"], counted["reduce"]
    assert {k: v for k, v in gather["collectives"].items() if v} == {
        "all-gather": gather["weight_bytes"] * 7 / 8}  # the gathered whole weight
    assert {k: v for k, v in reduce["collectives"].items() if v} == {
        "all-reduce": 2 * reduce["output_bytes"] * 7 / 8}  # the partial products summed


def test_a_collective_run_on_the_sparsecore_moves_its_buffers_once(counted):
    """XLA:TPU7x runs the all-gather on a SparseCore: `custom-call-start/update/done` around
    a computation holding it. The all-gather reads its shard and writes the whole weight;
    the wrappers, whose operands and results are those buffers again (and the SparseCore's
    scratch), move nothing of their own."""
    gather = counted["gather"]
    assert gather["sparsecore_wrappers"] == 1
    moved = dict(gather["moved"])
    assert not any(op.startswith("custom-call-") for op in moved)
    assert moved["all-gather"] == gather["weight_bytes"] / 8 + gather["weight_bytes"]


def test_a_loop_of_unreadable_length_is_refused_not_counted_once(counted):
    assert "trip count of %while cannot be read" in counted["unbounded_refused"]


def test_parse_reads_tuple_shapes_and_memory_spaces():
    """Arrays staged in on-chip memory (S(1)) are not HBM traffic; tuples count whole."""
    assert hlo.array_bytes("(f32[4,8]{1,0}, bf16[16]{0:T(8)S(1)})") == 4 * 32 + 2 * 16
    assert hlo.array_bytes("(f32[4,8]{1,0}, bf16[16]{0:T(8)S(1)})", hbm_only=True) == 4 * 32


PALLAS_BODY = '''HloModule m, num_partitions=1

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8] get-tuple-element(%p), index=1
  %k = f32[8] custom-call(%x), custom_call_target="tpu_custom_call", frontend_attributes={m={
"xprof_metadata":"{\\"block_q\\": 512}"
}}, backend_config={"custom_call_config":{"body":"x)}{"}}
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %out = (s32[], f32[8]) tuple(%next, %k)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]) parameter(0)
  %j = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%j, %n), direction=LT
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8] parameter(0)
  %zero = s32[] constant(0)
  %t = (s32[], f32[8]) tuple(%zero, %a)
  %w = (s32[], f32[8]) while(%t), condition=%cond, body=%body
  ROOT %r = f32[8] get-tuple-element(%w), index=1
}
'''


def test_an_instruction_whose_attributes_run_over_lines_is_one_instruction():
    """A Pallas kernel's custom call (splash attention on a TPU) prints its frontend
    attributes over several lines, one starting with '}': the loop body keeps the
    instructions after it, its ROOT included, and brackets inside strings do not count."""
    module = hlo.parse(PALLAS_BODY)
    assert [i.name for i in module.computations["body"]] == ["p", "i", "x", "k", "one",
                                                              "next", "out"]
    assert module.root("body").name == "out"
    assert module.by_name["k"].operands == ("x",)
    assert 'custom_call_target="tpu_custom_call"' in module.by_name["k"].attributes
    assert len(module.lines) == len(PALLAS_BODY.splitlines()) - 2
