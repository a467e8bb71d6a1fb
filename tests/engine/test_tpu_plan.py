"""The engine on XLA:TPU's own plan for TPU7x (`parity plan`, compile-only devices): the
layout and traffic figures issue 28 holds it to, asserted exactly on a tiny preset (slow: a
TPU compile of each arm)."""

import pathlib

import pytest

from harness.plan import hlo
from tests.harness.plan.test_cli_plan import plan_arms

pytestmark = pytest.mark.slow

SHAPE = ["--preset", "tiny-untied", "--seq", "32", "--batch", "16", "--ga", "2", "--mesh",
         "fsdp=8", "--scan-layers", "--remat", "full"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    return plan_arms(tmp_path_factory.mktemp("plans"), ["engine", "engine-fused", "native"],
                     *SHAPE, "--save-hlo")


def _text(record, executable: str) -> str:
    return (pathlib.Path(record.plan.hlo_dir) / f"{executable}.hlo.txt").read_text()


def test_gradients_and_accumulator_are_sharded_like_the_params(planned):
    """No replicated gradient or accumulator. XLA:TPU's byte counts are of tiled (padded)
    buffers, so they are compared with each other: the update aliases params, mu and nu
    (three buffers of the params' shapes, shards and dtype); what it takes besides them is
    the accumulator, which must be one more such buffer (and the step counter's few bytes),
    and the fwd/bwd hands back just that buffer (and its scalar sums and metrics).
    Replicated over fsdp=8, the accumulator would be ~8 of them."""
    p = planned["engine"].plan
    fwd_bwd, update = p.executables["fwd_bwd"], p.executables["update"]
    params = update.alias // 3
    assert 0 <= update.argument - update.alias - params <= 4096
    assert 0 <= fwd_bwd.output - params <= 4096
    for arm in ("engine-fused", "native"):  # the state a single jit is given, all aliased
        (step,) = planned[arm].plan.executables.values()
        assert 0 <= step.output - step.alias <= 4096
        assert abs(step.alias - update.alias) <= 4096  # the same params and moments


def test_the_update_moves_each_state_buffer_once(planned):
    """AdamW without the harness's capture: read p, g, m, v; write p, m, v: 7 passes of the
    parameter bytes over HBM (within 1.15x; the scalars are the rest)."""
    p = planned["engine"].plan
    params = p.resident_bytes["params"]
    assert 7 * params <= p.executables["update"].hbm_bytes <= 1.15 * 7 * params


def test_the_update_allocates_nothing_beyond_the_state_it_is_given(planned):
    """The update writes the new params and moments into the donated ones and holds the
    accumulator it cannot alias (engine.trainer's docstring): its footprint is its
    arguments and a few scalars, which every fwd/bwd holds too beside its activations, so
    the split engine's peak is a fwd/bwd's, never the update's."""
    p = planned["engine"].plan
    update = p.executables["update"]
    assert 0 <= update.output - update.alias + update.temp <= 4096
    assert p.peak_executable in ("fwd_bwd", "fwd_bwd_accumulate")


def _param_shard_shapes(text: str) -> set[str]:
    """The f32 shapes of the fused step's ENTRY parameters that are parameter shards."""
    module = hlo.parse(text)
    shapes = set()
    for inst in module.computations[module.entry]:
        if inst.opcode == "parameter" and inst.shape.startswith("f32[") and \
                hlo.array_bytes(inst.shape) >= 4096:
            shapes.add(inst.shape.split("{")[0])
    return shapes


def test_the_fused_accumulation_copies_no_parameter_sized_buffer_per_micro_batch(planned):
    """Inside the micro-batch loop of the fused step, no copy, transpose or re-tiling into
    HBM of a buffer shaped like a parameter shard (the accumulator's leaves): the sums are
    added in place, micro-batch after micro-batch. (Prefetches of weights into on-chip
    VMEM are staging, not copies of a buffer.)"""
    text = _text(planned["engine-fused"], "train_step")
    module = hlo.parse(text)
    shards = _param_shard_shapes(text)
    assert shards  # the tiny model's weights, sharded over 8 devices
    (loop,) = [i for i in module.computations[module.entry] if i.opcode == "while"
               and hlo.trip_count(module, i) == 2]
    reached, todo = set(), [loop.callees()["body"]]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [c for i in module.computations[name] for c in i.callees().values()
                     if c in module.computations]
    def written_to_hbm_as_a_shard(inst) -> bool:
        destination = hlo.tuple_elements(inst.shape)[0]  # copy-start: (dest, src, ...)
        return (destination.split("{")[0] in shards
                and hlo.array_bytes(destination, hbm_only=True) > 0)  # not VMEM staging

    copies = [i for name in reached for i in module.computations[name]
              if i.opcode in ("copy", "copy-start", "transpose") and
              written_to_hbm_as_a_shard(i)]
    assert copies == [], [f"{i.opcode} {i.shape[:60]}" for i in copies]


LONG = 1024
"""Tokens per row of the attention plan: its [L, S] scores (4 MiB per head and row in
float32) are far larger than any buffer the rest of the tiny model has."""


@pytest.fixture(scope="module")
def long_attention(tmp_path_factory):
    return plan_arms(tmp_path_factory.mktemp("attention"), ["engine"], "--preset",
                     "tiny-untied", "--seq", str(LONG), "--batch", "8", "--ga", "1", "--mesh",
                     "fsdp=8", "--scan-layers", "--remat", "full", "--save-hlo")["engine"]


def test_no_attention_sized_buffer_reaches_hbm(long_attention):
    """The decoder's attention normalizes its output, not its probabilities
    (`engine.model.decoder.attend`): at this size XLA:TPU then computes scores,
    exponentials and the value product inside fusions, in on-chip memory, and no [.., L, S]
    buffer of the forward, its rematerialization or the backward is written to HBM. With
    the softmax normalized first, the plan writes float32 probabilities to HBM
    (f32[2,2,1024,1024], 16 MiB, twice per layer) and the fwd/bwd moves 72.9 MB there
    instead of 5.7 MB.
    At qwen3-1.7b and 4096 tokens the scores themselves still go to HBM; the probabilities
    do not."""
    module = hlo.parse(_text(long_attention, "fwd_bwd"))
    fused = {i.callees()["calls"] for body in module.computations.values() for i in body
             if i.opcode == "fusion"}  # a fusion's insides live in registers and VMEM
    in_hbm = [f"{i.opcode} {shape[:60]}" for name, body in module.computations.items()
              if name not in fused for i in body for shape in hlo.tuple_elements(i.shape)
              if hlo.array_bytes(shape, hbm_only=True) > 0
              and shape.split("{")[0].count(str(LONG)) >= 2]
    assert in_hbm == []
