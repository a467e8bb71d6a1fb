"""Parameters a model reads only cast to its compute dtype, and their copies in that dtype.

A `Param` created with metadata `compute_dtype=D` promises that the model reads it exactly
once per call, as `value.astype(D)`: never in its stored dtype, never cast twice. A trainer
may then hand the model that parameter already cast. The model's own cast becomes a no-op,
so the loss is the same. The gradient is the same too: a cast's cotangent is its result's
cotangent cast back, so the D-typed cotangent of the copy, cast to float32 by the trainer,
is the float32 cotangent the parameter would have had. (Read twice, the two cotangents would be
summed in D here and in float32 there: hence "exactly once".)

What it saves: with gradient accumulation run as one program per micro-batch, each program
casts every such parameter again (read float32, write bfloat16: 6 bytes an element, per
micro-batch), where one program over all micro-batches casts once (XLA hoists the cast out
of its loop). Cast once per optimizer step, the accumulating programs read the copies.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

COMPUTE_DTYPE = "compute_dtype"
"""The `Param` metadata naming the dtype a model reads that parameter in (see above)."""

Casts = tuple[jnp.dtype | None, ...]
"""Per leaf of a params tree (`jax.tree.leaves` order): the dtype its copy is cast to, or None
for a leaf the model reads as stored."""


def compute_dtypes(params: nnx.State) -> Casts:
    """Each leaf's `compute_dtype` metadata where it names a dtype other than the stored one."""
    def cast(leaf) -> jnp.dtype | None:
        if not isinstance(leaf, nnx.Variable) or COMPUTE_DTYPE not in leaf.get_metadata():
            return None
        wanted = jnp.dtype(leaf.get_metadata()[COMPUTE_DTYPE])
        return None if wanted == leaf.get_raw_value().dtype else wanted

    is_variable = lambda x: isinstance(x, nnx.Variable)
    return tuple(map(cast, jax.tree.leaves(params, is_leaf=is_variable)))


def copies(params, casts: Casts) -> tuple[jax.Array, ...]:
    """The cast copies of the leaves `casts` names, in leaf order (nothing for the others)."""
    return tuple(p.astype(d) for p, d in zip(jax.tree.leaves(params), casts, strict=True)
                 if d is not None)


def with_copies(params, cast: tuple[jax.Array, ...], casts: Casts, *, through: bool = False):
    """`params` with each leaf `casts` names replaced by its copy from `cast` (same tree);
    `through`: read through it (`read_copy`: the copy's value, the leaf's gradient)."""
    leaves, treedef = jax.tree.flatten(params)
    found = iter(cast)
    return jax.tree.unflatten(treedef, [
        p if d is None else read_copy(p, next(found)) if through else next(found)
        for p, d in zip(leaves, casts, strict=True)])


def copy_shapes(params, shardings, casts: Casts) -> tuple[jax.ShapeDtypeStruct, ...]:
    """What `copies` returns, as shapes laid out by `shardings` (the params' shardings)."""
    return tuple(jax.ShapeDtypeStruct(p.shape, d, sharding=s) for p, s, d in zip(
        jax.tree.leaves(params), jax.tree.leaves(shardings), casts, strict=True)
        if d is not None)


def leaf_shardings(shardings, casts: Casts) -> tuple:
    """The shardings of the leaves `casts` names, in the order `copies` returns them."""
    return tuple(s for s, d in zip(jax.tree.leaves(shardings), casts, strict=True)
                 if d is not None)


@jax.custom_vjp
def read_copy(param: jax.Array, copy: jax.Array) -> jax.Array:
    """`copy` (a parameter's compute-dtype copy) in `param`'s dtype, differentiated as
    `param`: the cotangent reaches `param` in its own dtype, so a program that reads a layer
    stack through it stores each layer's gradient in float32, as one casting the float32
    parameter itself does, never in the copy's dtype. The model's own cast of the value back
    to the compute dtype is exact (the value is the copy's), and `param` is never read."""
    return copy.astype(param.dtype)


def _read_copy_fwd(param, copy):
    return copy.astype(param.dtype), None


def _read_copy_bwd(_, cotangent):
    return cotangent, None  # the copy is not differentiated: no cotangent of its own


read_copy.defvjp(_read_copy_fwd, _read_copy_bwd)
