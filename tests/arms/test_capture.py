import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from arms.capture import captured_gradient, with_capture
from arms.workload import TokenCrossEntropy, make_micro_batches, rel_l2
from engine.model import Decoder, get_preset


def test_capture_keeps_exactly_the_gradient_the_optimizer_receives():
    model = Decoder(get_preset("tiny"), rngs=nnx.Rngs(0))
    graph, params = nnx.split(model, nnx.Param)
    (batch,) = make_micro_batches(seed=0, batch_size=2, seq_len=16, vocab_size=256)
    loss = TokenCrossEntropy()
    grads = jax.grad(lambda p: loss(nnx.merge(graph, p), batch).loss_sum)(params)
    tx = with_capture(optax.adamw(1e-3))
    state = tx.init(params)
    assert all(float(jnp.abs(x).max()) == 0 for x in jax.tree.leaves(captured_gradient(state)))
    updates, state = tx.update(grads, state, params)
    assert rel_l2(captured_gradient(state), grads) == 0.0
    # The capture passes updates through: adamw's first step moves each weight by ~lr.
    assert rel_l2(updates, grads) > 0.5


def test_missing_capture_is_a_clear_error():
    state = optax.sgd(0.1).init({"w": jnp.ones(3)})
    with pytest.raises(ValueError, match="with_capture"):
        captured_gradient(state)
