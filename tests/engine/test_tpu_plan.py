"""The engine on XLA:TPU's own plan for TPU7x (`parity plan`, compile-only devices): the
layout and traffic figures issue 28 holds it to, asserted exactly on a tiny preset (slow: a
TPU compile of each arm)."""

import pathlib

import pytest

from harness.xla import hlo, loops
from tests.harness.cli.test_cli_plan import plan_arms

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


@pytest.fixture(scope="module")
def large_update(tmp_path_factory):
    """The engine planned at qwen3-0.6b (298 MB of float32 params per device over fsdp=8,
    far beyond on-chip memory, so every pass over the state goes through HBM; a tiny
    model's state fits on chip, where a second read of it costs no HBM bytes), at 16
    tokens so the fwd/bwd compiles fast."""
    return plan_arms(tmp_path_factory.mktemp("large"), ["engine"], "--preset", "qwen3-0.6b",
                     "--seq", "16", "--batch", "8", "--ga", "1", "--mesh", "fsdp=8",
                     "--scan-layers", "--remat", "full")["engine"]


def test_the_update_moves_each_state_buffer_once(large_update):
    """AdamW without the harness's capture: read p, g, m, v; write p, m, v: 7 passes of the
    parameter bytes over HBM. The rest is scalars (step count, finite flag, loss sums: a
    few 512-byte TPU tiles), so one more pass over any state buffer (298 MB) fails."""
    p = large_update.plan
    params = p.resident_bytes["params"]
    assert 0 <= p.executables["update"].hbm_bytes - 7 * params <= 4096


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


@pytest.fixture(scope="module")
def large_fused(tmp_path_factory):
    """engine-fused at qwen3-0.6b, GA 2 (see `large_update`: its accumulator does not fit
    on chip, so a per-micro-batch copy of it goes through HBM)."""
    return plan_arms(tmp_path_factory.mktemp("large-fused"), ["engine-fused"], "--preset",
                     "qwen3-0.6b", "--seq", "16", "--batch", "16", "--ga", "2", "--mesh",
                     "fsdp=8", "--scan-layers", "--remat", "full",
                     "--save-hlo")["engine-fused"]


def test_the_fused_accumulation_copies_no_parameter_sized_buffer_per_micro_batch(
        large_fused):
    """Inside the micro-batch loop of the fused step, no copy, transpose or re-tiling into
    HBM of a buffer shaped like a parameter shard (the accumulator's leaves): the sums are
    added in place, micro-batch after micro-batch. Moves between on-chip VMEM and HBM are
    the memory-space assignment's staging of a buffer, not copies of it: a prefetch into
    VMEM, or an eviction from VMEM (the norm scales' small sums are)."""
    text = _text(large_fused, "train_step")
    module = hlo.parse(text)
    shards = _param_shard_shapes(text)
    assert len(shards) >= 7  # the scanned layers' weights and norms, the embedding, the head
    (loop,) = [i for i in module.computations[module.entry] if i.opcode == "while"
               and loops.trip_count(module, i) == 2]
    reached, todo = set(), [loop.callees()["body"]]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [c for i in module.computations[name] for c in i.callees().values()
                     if c in module.computations]

    def written_to_hbm_as_a_shard(inst) -> bool:
        destination, *source = hlo.tuple_elements(inst.shape)  # copy-start: (dest, src, ..)
        staged = bool(source) and hlo.array_bytes(source[0], hbm_only=True) == 0
        return (destination.split("{")[0] in shards and not staged
                and hlo.array_bytes(destination, hbm_only=True) > 0)  # not into VMEM

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
    (`engine.model.attention.attend`): at this size XLA:TPU then computes scores,
    exponentials and the value product inside fusions, in on-chip memory, and no [.., L, S]
    buffer of the forward, its rematerialization or the backward is written to HBM. With
    the softmax normalized first, the plan keeps a float32 probability-sized buffer in HBM
    (a fusion's f32[2,2,1024,1024] output, 16 MiB) and the fwd/bwd moves 72.9 MB there
    instead of 5.7 MB. At qwen3-1.7b and 4096 tokens the scores themselves still go to
    HBM; the probabilities do not."""
    module = hlo.parse(_text(long_attention, "fwd_bwd"))
    fused = {i.callees()["calls"] for body in module.computations.values() for i in body
             if i.opcode == "fusion"}  # a fusion's insides live in registers and VMEM
    in_hbm = [f"{i.opcode} {shape[:60]}" for name, body in module.computations.items()
              if name not in fused for i in body for shape in hlo.tuple_elements(i.shape)
              if hlo.array_bytes(shape, hbm_only=True) > 0
              and shape.split("{")[0].count(str(LONG)) >= 2]
    assert in_hbm == []
