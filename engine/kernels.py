"""Pure step kernels. `TrainingEngine` jits, shards, donates and calls them.

Normalization is sum/sum: each micro-batch contributes an *unnormalized* loss sum and its
denominator (token count or weight sum); gradients accumulate unnormalized in float32, and
the update scales once by 1 / sum(denominators). Any other order (a mean per micro-batch,
then a mean of means) weighs tokens of small micro-batches more than tokens of large ones.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from engine.model import precast

LossFn = Callable[[nnx.Module, Any], tuple[jax.Array, jax.Array, dict[str, jax.Array]]]
"""(model, micro_batch) -> (loss_sum, denominator, aux sums); aux loss terms are in loss_sum."""


class MicroBatchMetrics(NamedTuple):
    """What one micro-batch reports: float32 scalars (or [GA] vectors from the fused step)."""

    loss_sum: jax.Array
    denominator: jax.Array
    aux: dict[str, jax.Array]


class Accumulator(NamedTuple):
    """Unnormalized running sums over the micro-batches of one optimizer step."""

    grads: nnx.State
    """float32 gradient sums, sharded like the params."""
    loss_sum: jax.Array
    denominator: jax.Array


class UpdateConfig(NamedTuple):
    """Static settings of the update kernel."""

    grad_dtype: jnp.dtype | None
    clip_threshold: float | None


def _as_f32(x: jax.Array) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def fwd_bwd(graph: nnx.GraphDef, loss_fn: LossFn, params: nnx.State, rest: nnx.State,
            batch, read: Callable[[nnx.State], nnx.State] | None = None
            ) -> tuple[Accumulator, nnx.State, MicroBatchMetrics]:
    """Loss sum and its float32 gradient for one micro-batch, and the non-Param state after it.
    `read`: what the model reads in place of `params` (differentiated through), if not them."""

    def objective(params):
        # copy=True makes fresh Variables at this (grad) trace level, so the loss may mutate
        # non-Param state; the state's own Variables belong to the enclosing jit trace.
        model = nnx.merge(graph, read(params) if read else params, rest, copy=True)
        loss_sum, denominator, aux = loss_fn(model, batch)
        return loss_sum, (denominator, aux, nnx.state(model, nnx.Not(nnx.Param)))

    (loss_sum, (denominator, aux, new_rest)), grads = jax.value_and_grad(
        objective, has_aux=True)(params)
    metrics = MicroBatchMetrics(_as_f32(loss_sum), _as_f32(denominator),
                                {k: _as_f32(v) for k, v in aux.items()})
    acc = Accumulator(jax.tree.map(_as_f32, grads), metrics.loss_sum, metrics.denominator)
    return acc, new_rest, metrics


def accumulate(acc: Accumulator, new: Accumulator) -> Accumulator:
    """Elementwise sum; with `acc` donated XLA adds into its buffers in place."""
    return jax.tree.map(jnp.add, acc, new)


def fwd_bwd_accumulate(graph, loss_fn, acc: Accumulator, params, rest, batch, read=None):
    new, new_rest, metrics = fwd_bwd(graph, loss_fn, params, rest, batch, read)
    return accumulate(acc, new), new_rest, metrics


def accumulate_reading_copies(graph, loss_fn, casts, float32_gradient: bool):
    """fwd_bwd_accumulate(acc, params, copies, rest, batch) of a step whose first fwd_bwd made
    the compute-dtype `copies` (engine.model.precast): the model reads them in place of the
    float32 leaves they cast, differentiated as the copies (their gradients in the copies'
    dtype until the accumulator's add) or, with `float32_gradient`, as the float32 leaves
    read through them (EngineConfig.copies_float32_gradient)."""
    if float32_gradient:
        return lambda a, p, c, r, b: fwd_bwd_accumulate(
            graph, loss_fn, a, p, r, b, lambda q: precast.with_copies(q, c, casts, through=True))
    return lambda a, p, c, r, b: fwd_bwd_accumulate(
        graph, loss_fn, a, precast.with_copies(p, c, casts), r, b)


def gradient_scale(cfg: UpdateConfig, acc: Accumulator) -> jax.Array:
    """The one scalar every accumulated gradient element is multiplied by.

    1 / sum(denominators), zero when no token carried loss weight (a 0/0 step applies a zero
    gradient instead of NaNs); with clipping, times min(1, threshold / norm of the normalized
    gradient), so normalizing and clipping cost one multiply per element, not two passes.
    """
    scale = jnp.where(acc.denominator > 0, 1.0 / acc.denominator, 0.0)
    if cfg.clip_threshold is not None:
        norm = optax.tree.norm(acc.grads) * scale  # float32, before any cast
        scale = scale * jnp.minimum(1.0, cfg.clip_threshold / norm)
    return scale


def apply_update(tx: optax.GradientTransformation, cfg: UpdateConfig, params: nnx.State,
                 opt_state, step: jax.Array, acc: Accumulator):
    """One optimizer step from the accumulated sums; skipped if the step loss is not finite.

    Returns (params, opt_state, step, finite): nothing else leaves the kernel, so nothing
    else is computed. `step` counts applied updates and is the scalar the host throttles on.
    """
    finite = jnp.isfinite(acc.loss_sum)

    def update(params, opt_state):
        scale = gradient_scale(cfg, acc)
        grads = jax.tree.map(lambda g, p: (g * scale).astype(cfg.grad_dtype or p.dtype),
                             acc.grads, params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # A non-finite step keeps the old params and optimizer state. With the state donated,
    # the identity branch costs nothing and the update branch writes in place: XLA emits one
    # loop per output (3 reads + 1 write for a moment). An elementwise select over the new
    # and old states instead makes XLA keep copies of the old moments for the param loop to
    # re-read (measured on CPU: 18 param-sized passes for AdamW + capture against 12).
    # XLA:GPU may read the predicate back to the host to choose the branch (a sync per
    # update) where its command buffers do not cover conditionals.
    params, opt_state = jax.lax.cond(finite, update, lambda p, o: (p, o), params, opt_state)
    return params, opt_state, step + finite.astype(step.dtype), finite


def zeros_like_accumulator(params: nnx.State, shardings=None) -> Accumulator:
    """Zero gradient sums laid out by `shardings` (shardings, or PartitionSpecs of the mesh
    the kernel is traced under), and zero loss and denominator sums."""
    grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
    if shardings is not None:
        grads = jax.lax.with_sharding_constraint(grads, shardings)
    zero = jnp.zeros((), jnp.float32)
    return Accumulator(grads, zero, zero)


def fused_step(graph, loss_fn, tx, cfg: UpdateConfig, grad_shardings, params, opt_state, rest,
               step, batches: Sequence[Any]):
    """A whole optimizer step in one executable: fwd/bwd at GA=1, lax.scan over GA > 1."""
    if len(batches) == 1:
        acc, rest, metrics = fwd_bwd(graph, loss_fn, params, rest, batches[0])
        metrics = jax.tree.map(lambda x: x[None], metrics)
    else:
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)

        def body(carry, batch):
            acc, rest = carry
            acc, rest, metrics = fwd_bwd_accumulate(graph, loss_fn, acc, params, rest, batch)
            return (acc, rest), metrics

        init = zeros_like_accumulator(params, grad_shardings)
        (acc, rest), metrics = jax.lax.scan(body, (init, rest), stacked)
    params, opt_state, step, finite = apply_update(tx, cfg, params, opt_state, step, acc)
    return params, opt_state, rest, step, finite, metrics
