"""arms.workload.optimizers: the gradient an optimizer's first update saw, read back from
its own state (what the parity check reads instead of a capture chained into the step)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from arms.capture import with_capture
from arms.workload.optimizers import first_gradient, gradient_state, optimizer_tx

# Gradients spanning the magnitudes a model's have (1e-9 .. 1e2), signs mixed.
RNG = np.random.default_rng(0)
GRADS = {"w": (RNG.standard_normal((64, 33)) * 10.0 ** RNG.integers(-9, 3, (64, 33))
               ).astype(np.float32),
         "b": {"x": RNG.standard_normal(7).astype(np.float32)}}
PARAMS = jax.tree.map(lambda g: jnp.ones_like(g), GRADS)

ONE_ROUNDING = 2.0**-24
"""float32's unit roundoff: reading AdamW's moment back rounds twice (the moment's multiply
by 1 - b1, then the division by it), so each element is within 2 of these of the gradient."""


def _stepped(name: str, steps: int = 1):
    tx = optimizer_tx(name, 1e-3)
    state = tx.init(PARAMS)
    for _ in range(steps):
        _, state = tx.update(GRADS, state, PARAMS)
    return state


def _read(state) -> dict:
    tree, factor = gradient_state(state)
    return first_gradient(jax.device_get(tree), factor)


def test_adamw_s_first_moment_reads_back_as_the_gradient_within_two_roundings():
    got = _read(_stepped("adamw"))
    for mine, theirs in zip(jax.tree.leaves(got), jax.tree.leaves(GRADS), strict=True):
        assert mine.dtype == np.float32
        error = np.abs(mine.astype(np.float64) - theirs) / np.abs(theirs)
        assert error.max() <= 2 * ONE_ROUNDING, error.max()
    # the moment itself is not the gradient: the factor is what is divided out
    tree, factor = gradient_state(_stepped("adamw"))
    assert factor == pytest.approx(0.1) and not np.allclose(tree["w"], GRADS["w"])


def test_adamw_s_moment_after_two_updates_is_refused():
    with pytest.raises(ValueError, match="has seen 2 updates"):
        gradient_state(_stepped("adamw", steps=2))


def test_sgd_keeps_the_gradient_in_its_trace_and_updates_as_plain_sgd():
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(_read(_stepped("sgd"))), jax.tree.leaves(GRADS), strict=True))
    ours, _ = optimizer_tx("sgd", 1e-3).update(GRADS, optimizer_tx("sgd", 1e-3).init(PARAMS))
    plain, _ = optax.sgd(1e-3).update(GRADS, optax.sgd(1e-3).init(PARAMS))
    assert all(np.array_equal(a, b) for a, b in zip(
        jax.tree.leaves(ours), jax.tree.leaves(plain), strict=True))


def test_a_capture_in_the_state_is_read_first_and_a_state_without_one_is_refused():
    tx = with_capture(optimizer_tx("adamw", 1e-3))
    _, state = tx.update(GRADS, tx.init(PARAMS), PARAMS)
    tree, factor = gradient_state(state)
    assert factor == 1.0 and np.array_equal(tree["w"], GRADS["w"])
    with pytest.raises(ValueError, match="keeps no gradient to read back"):
        gradient_state(optax.sgd(1e-3).init(PARAMS))
    with pytest.raises(ValueError, match="unknown optimizer 'lion'; valid: adamw, sgd"):
        optimizer_tx("lion", 1e-3)
