"""Black-box gradient capture: an optax transformation chained in front of an optimizer.

It passes the incoming updates through unchanged and keeps a copy in its state, so the
gradient an optimizer really saw can be read from any optax-based trainer's opt_state, at
the cost of a parameter-sized buffer written every step. The harness does not chain it into
the arms it times (it reads the workload's optimizers' own state instead:
arms.workload.optimizers); it serves tests of an engine with any optimizer, and a plugin arm
that chains it itself is read through it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class CapturedGradient(NamedTuple):
    grads: Any
    """The last updates that reached this transformation (zeros before the first step)."""


def capture_gradient(dtype=None) -> optax.GradientTransformation:
    """Identity transform that records its input. `dtype`: storage dtype of the copy (default:
    the param dtype); set it when the trainer casts gradients, so the state keeps one type."""

    def init(params):
        return CapturedGradient(jax.tree.map(
            lambda p: jnp.zeros(p.shape, dtype or p.dtype), params))

    def update(updates, state, params=None):
        del state, params
        return updates, CapturedGradient(jax.tree.map(
            lambda u: u.astype(dtype) if dtype else u, updates))

    return optax.GradientTransformation(init, update)


def with_capture(tx: optax.GradientTransformation, dtype=None) -> optax.GradientTransformation:
    """`tx` with a gradient capture in front of it."""
    return optax.chain(capture_gradient(dtype), tx)


def states_of(opt_state, kind: type) -> list:
    """Every state of transform state type `kind` (a NamedTuple: CapturedGradient, optax's
    ScaleByAdamState, ...) in `opt_state`, in tree order."""
    return [x for x in jax.tree.leaves(opt_state, is_leaf=lambda x: isinstance(x, kind))
            if isinstance(x, kind)]


def captured_gradient(opt_state) -> Any:
    """The gradient kept by the (first) capture transform found in `opt_state`."""
    found = states_of(opt_state, CapturedGradient)
    if not found:
        raise ValueError("no capture_gradient() state in this optimizer state; build the "
                         "optimizer with arms.capture.with_capture(tx)")
    return found[0].grads
