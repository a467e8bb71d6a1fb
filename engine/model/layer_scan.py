"""A scan over a stack of identical layers whose backward writes each layer's weight gradient
into an uninitialized buffer (`DecoderConfig.scan_backward="unfilled"`).

Differentiating `jax.lax.scan` over stacked weights makes the weights' gradient a stacked
output of the transposed scan, and JAX starts every stacked output as a broadcast of zeros
that the loop's iterations then overwrite slice by slice: for qwen3-0.6b 1.641 GiB of float32
zeros written each step (the 28 layers' parameters x 4 bytes) that no one reads. Here the
backward is a scan of its own whose carry holds the stacked gradient, started by
`jax.lax.empty` (on a TPU or GPU an uninitialized allocation; elsewhere zeros) and written one
layer at a time in place. Each layer's forward is recomputed from its saved input, as
`remat="full"` does: the same arithmetic, in the same order, as the checkpointed
`jax.lax.scan`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from engine.model.sharding import constrain

Block = Callable[[Sequence[jax.Array], jax.Array, Any], jax.Array]
"""block(one layer's weight leaves, x_BxLxD, consts) -> x_BxLxD."""


class LayerStack(NamedTuple):
    """What the scan holds static: the layer's function and each weight leaf's logical axes
    (with the leading `layers` axis), which lay the gradient buffer out like the weights."""

    block: Block
    axes: tuple[tuple[str | None, ...] | None, ...]


def scan_unfilled(stack: LayerStack, x_BxLxD: jax.Array, leaves: Sequence[jax.Array],
                  consts: Any) -> jax.Array:
    """x after every layer of `leaves` (each [layers, ...]) in turn; `consts` (arrays the
    block reads, e.g. positions and masks) get no gradient."""
    return _scan(stack, x_BxLxD, list(leaves), consts)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _scan(stack, x_BxLxD, leaves, consts):
    return jax.lax.scan(lambda x, layer: (stack.block(layer, x, consts), None),
                        x_BxLxD, leaves)[0]


def _forward(stack, x_BxLxD, leaves, consts):
    """The scan, keeping each layer's input [layers, B, L, D]: all the backward reads."""
    y_BxLxD, inputs_NxBxLxD = jax.lax.scan(
        lambda x, layer: (stack.block(layer, x, consts), x), x_BxLxD, leaves)
    return y_BxLxD, (inputs_NxBxLxD, leaves, consts)


def _backward(stack, saved, dy_BxLxD):
    inputs_NxBxLxD, leaves, consts = saved
    grads = [constrain(jax.lax.empty(leaf.shape, leaf.dtype), axes) if axes
             else jax.lax.empty(leaf.shape, leaf.dtype)
             for leaf, axes in zip(leaves, stack.axes, strict=True)]

    def layer_back(carry, i):
        dx_BxLxD, grads = carry
        layer = [jax.lax.dynamic_index_in_dim(leaf, i, keepdims=False) for leaf in leaves]
        x_BxLxD = jax.lax.dynamic_index_in_dim(inputs_NxBxLxD, i, keepdims=False)
        _, vjp = jax.vjp(lambda w, x: stack.block(w, x, consts), layer, x_BxLxD)
        dlayer, dx_BxLxD = vjp(dx_BxLxD)
        grads = [jax.lax.dynamic_update_index_in_dim(g, d.astype(g.dtype), i, 0)
                 for g, d in zip(grads, dlayer, strict=True)]
        return (dx_BxLxD, grads), None

    layers = inputs_NxBxLxD.shape[0]
    (dx_BxLxD, grads), _ = jax.lax.scan(layer_back, (dy_BxLxD, grads),
                                        jnp.arange(layers - 1, -1, -1))
    return dx_BxLxD, grads, jax.tree.map(_no_cotangent, consts)


def _no_cotangent(x: jax.Array):
    """The zero cotangent of an input nothing differentiates (float0 for integers, bools)."""
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.zeros_like(x)
    return np.zeros(x.shape, jax.dtypes.float0)


_scan.defvjp(_forward, _backward)
