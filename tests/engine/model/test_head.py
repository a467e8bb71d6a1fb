"""The output head and loss statistics in chunks of positions (`logits_chunk`) against the
whole logits: the same values and gradients to float32 round-off, and no float32 [B, L, V]
buffer in the compiled program.

Tolerance (float32, u = 2^-24 per operation, eps = 2^-23): each token's log-normalizer and
target log-probability reduce the same V logits either way, so a loss sum differs only by
the chunk matmuls' blocking and the order of the sum over tokens: a few eps. The head's
gradient is summed chunk by chunk where the whole computation sums all positions in one
product: each element's sum is reassociated, a relative l2 error of order eps (measured
0.5-1.2e-7 on `small`). TOL = 8 eps (9.5e-7) holds both with room; a chunk that dropped or
doubled a token, a wrong target or a missing z-loss term is off by orders of magnitude more.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from arms.workload import (
    ClippedPolicyGradient,
    TokenCrossEntropy,
    make_micro_batches,
    rel_l2,
)
from engine.model import Decoder, DecoderConfig, build_decoder, get_preset, make_mesh
from engine.model.sharding import sharding_context

TOL = 8 * 2.0**-23
LOSSES = [TokenCrossEntropy(z_loss_weight=1e-4), ClippedPolicyGradient()]


def _objective(loss, config, batch):
    """(graph, params, loss_sum as a function of the params) of `loss` on `config`."""
    graph, state = nnx.split(build_decoder(config, seed=0))
    return state, lambda state: loss(nnx.merge(graph, state), batch).loss_sum


# Each head layout (tied: the embedding read as [V, D]; untied: [D, V]) and each loss runs
# in make test; their two other pairings, the same code paths compiled again, with the slow.
SLOW_PAIR = pytest.mark.slow


@pytest.mark.parametrize(("preset", "loss"), [
    pytest.param("small", LOSSES[0], id="small-xent"),
    pytest.param("small-untied", LOSSES[1], id="small-untied-grpo"),
    pytest.param("small", LOSSES[1], id="small-grpo", marks=SLOW_PAIR),
    pytest.param("small-untied", LOSSES[0], id="small-untied-xent", marks=SLOW_PAIR)])
def test_chunked_loss_is_the_whole_logits_loss_value_and_gradient(preset, loss):
    config = get_preset(preset)
    batch = make_micro_batches(seed=3, batch_size=2, seq_len=128, vocab_size=config.vocab_size,
                               mask_fraction=0.7, grpo=loss.name == "grpo")[0]
    state, whole = _objective(loss, config, batch)
    value, grad = jax.jit(jax.value_and_grad(whole))(state)
    _, chunked = _objective(loss, config.replace(logits_chunk=32), batch)  # 4 chunks
    chunk_value, chunk_grad = jax.jit(jax.value_and_grad(chunked))(state)
    assert abs(float(chunk_value) - float(value)) <= TOL * abs(float(value))
    assert rel_l2(nnx.to_pure_dict(chunk_grad), nnx.to_pure_dict(grad)) <= TOL


def test_chunked_loss_under_fsdp_is_the_one_device_loss(devices):
    """Rows sharded over 4 devices, the head's parameters over fsdp: the same sums."""
    config = get_preset("tiny")
    batch = make_micro_batches(seed=0, batch_size=4, seq_len=64, vocab_size=256)[0]
    loss = LOSSES[0]
    state, whole = _objective(loss, config, batch)
    value, grad = jax.jit(jax.value_and_grad(whole))(state)
    mesh = make_mesh("fsdp=4")
    graph, sharded = nnx.split(build_decoder(config.replace(logits_chunk=16), mesh=mesh))
    with sharding_context(mesh):
        chunk_value, chunk_grad = jax.jit(jax.value_and_grad(
            lambda s: loss(nnx.merge(graph, s), batch).loss_sum))(sharded)
    assert abs(float(chunk_value) - float(value)) <= TOL * abs(float(value))
    assert rel_l2(nnx.to_pure_dict(chunk_grad), nnx.to_pure_dict(grad)) <= TOL


# One layer, a vocabulary 128x the width and 8x more tokens than the width: the float32 logits
# (16 MiB) dominate the program's memory, as on a real model at a long sequence.
WIDE_VOCAB = DecoderConfig(vocab_size=8192, embed_dim=64, num_layers=1, num_heads=4,
                           num_kv_heads=2, head_dim=16, mlp_dim=128)
ROWS, SEQ = 2, 256


def _compiled(chunk: int):
    """The compiled gradient of the xent + z-loss sum (abstract weights: nothing runs)."""
    config = WIDE_VOCAB.replace(logits_chunk=chunk)
    graph, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    batch = make_micro_batches(seed=0, batch_size=ROWS, seq_len=SEQ,
                               vocab_size=config.vocab_size)[0]
    loss = LOSSES[0]
    return jax.jit(jax.grad(lambda s: loss(nnx.merge(graph, s), batch).loss_sum)).lower(
        state).compile()


def _largest_f32(compiled) -> int:
    """Elements of the largest float32 array any instruction of the optimized HLO makes."""
    shapes = re.findall(r"f32\[([0-9,]+)\]", compiled.as_text())
    return max(int(np.prod([int(n) for n in s.split(",")])) for s in shapes if s)


def test_chunks_never_hold_the_float32_logits_and_plan_less_memory():
    """Deterministic: XLA's own buffer plan. With 32-position chunks no instruction makes a
    float32 array as large as the [B, L, V] logits (the whole computation makes several:
    logits, exponentials, their gradient), the largest is at most one chunk's [B, 32, V] or
    the [V, D] gradient sum, and the temporaries shrink by more than one logits buffer."""
    logits = ROWS * SEQ * WIDE_VOCAB.vocab_size
    whole, chunked = _compiled(0), _compiled(32)
    assert _largest_f32(whole) == logits
    assert _largest_f32(chunked) <= max(ROWS * 32 * WIDE_VOCAB.vocab_size,
                                        WIDE_VOCAB.vocab_size * WIDE_VOCAB.embed_dim)
    saved = (whole.memory_analysis().temp_size_in_bytes
             - chunked.memory_analysis().temp_size_in_bytes)
    assert saved > 4 * logits


def test_a_chunk_that_does_not_tile_the_sequence_is_refused_naming_the_fix():
    config = get_preset("tiny", logits_chunk=48)
    batch = make_micro_batches(seed=0, batch_size=2, seq_len=64, vocab_size=256)[0]
    state, objective = _objective(LOSSES[0], config, batch)
    with pytest.raises(ValueError, match=r"logits_chunk=48 does not divide seq 64.*pass "
                                         r"--logits-chunk with a divisor of 64 \(e.g. 32\)"):
        jax.eval_shape(objective, state)


def test_the_decoders_call_still_returns_whole_logits():
    config = get_preset("tiny", logits_chunk=16)
    batch = make_micro_batches(seed=0, batch_size=2, seq_len=32, vocab_size=256)[0]
    logits = build_decoder(config)(batch.tokens, batch.positions, batch.segment_ids)
    assert logits.shape == (2, 32, 256) and logits.dtype == jnp.float32
