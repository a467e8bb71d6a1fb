"""The workload's optimizers, and the gradient their first update saw, read back from their
own state.

The parity check compares the gradient a trainer's optimizer received in the first step with
the exact reference. Nothing is added to the trainer's program to get it: each optimizer
here keeps that gradient, exactly recoverable, in the state it keeps anyway, so the step a
cell times is the trainer's own program whether or not its parity is checked.

- AdamW's first moment starts at zero and its first update writes `(1 - b1) * g` (optax's
  `update_moment`: `(1 - b1) * g + b1 * 0`, one float32 multiply by the float32 value of
  `1 - b1`). Dividing by that same float32 value gives `g` back within one rounding of each
  operation, a relative error of at most ~1.2e-7 an element: a hundred times below the
  tightest parity tolerance (reports.parity.GRAD_TOLERANCE, 1e-5). The step count must be 1:
  after more updates the moment mixes several gradients.
- SGD is written as a trace of decay 0 (`optax.sgd(lr, momentum=0.0)`): its update is plain
  SGD's to the bit (`g + 0 * t = g`), and its trace holds the last gradient exactly, at the
  cost of one parameter-sized buffer that every arm holds alike.

An optimizer state holding a `arms.capture.CapturedGradient` (a plugin arm that chains the
capture in itself) is read from that instead.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

OPTIMIZERS = ("adamw", "sgd")
ADAMW_B1 = 0.9
"""AdamW's first-moment decay (optax's default), stated so its first moment can be read
back as the gradient."""


def optimizer_tx(name: str, learning_rate: float) -> optax.GradientTransformation:
    """The workload's optimizer `name` at `learning_rate` (see the module docstring)."""
    if name == "adamw":
        return optax.adamw(learning_rate, b1=ADAMW_B1)
    if name == "sgd":
        return optax.sgd(learning_rate, momentum=0.0)
    raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")


def _array(value):
    """A state leaf's array (an nnx optimizer keeps each in a Variable)."""
    return value.get_value() if isinstance(value, nnx.Variable) else value


def _scalar(value) -> int:
    """A scalar state leaf as an int."""
    return int(np.asarray(jax.device_get(_array(value))))


def gradient_state(opt_state) -> tuple[Any, float]:
    """(the part of `opt_state` that holds the gradient of the one update it has seen, the
    float32 factor it was multiplied by there): a gradient capture's copy (factor 1), AdamW's
    first moment (1 - b1) or SGD's trace (1). The tree is left where it is (on the devices):
    `first_gradient` reads it on the host. Raises where the state holds none."""
    from arms.capture import CapturedGradient, states_of

    captured = states_of(opt_state, CapturedGradient)
    if captured:
        return captured[0].grads, 1.0
    adam = states_of(opt_state, optax.ScaleByAdamState)
    if adam:
        count = _scalar(adam[0].count)
        if count != 1:
            raise ValueError(f"AdamW's state has seen {count} updates; its first moment is "
                             "the gradient only after exactly one (read it after step 1)")
        return adam[0].mu, float(np.float32(1 - ADAMW_B1))
    trace = states_of(opt_state, optax.TraceState)
    if trace:
        return trace[0].trace, 1.0
    raise ValueError("this optimizer state keeps no gradient to read back (no AdamW first "
                     "moment, SGD trace or gradient capture); build the optimizer with "
                     "arms.workload.optimizers.optimizer_tx")


def first_gradient(host_tree, factor: float) -> Any:
    """The gradient `gradient_state` located, from its host copy `host_tree` (numpy leaves;
    nnx Variables unwrapped): each leaf divided by `factor` in float64, then float32."""
    divisor = np.float64(np.float32(factor))

    def leaf(x):
        x = np.asarray(_array(x))
        return x if divisor == 1.0 else (x.astype(np.float64) / divisor).astype(np.float32)

    return jax.tree.map(leaf, host_tree)
