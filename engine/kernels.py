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
            batch) -> tuple[Accumulator, nnx.State, MicroBatchMetrics]:
    """Loss sum and its float32 gradient for one micro-batch, and the non-Param state after it."""

    def objective(params):
        # copy=True makes fresh Variables at this (grad) trace level, so the loss may mutate
        # non-Param state; the state's own Variables belong to the enclosing jit trace.
        model = nnx.merge(graph, params, rest, copy=True)
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


def fwd_bwd_accumulate(graph, loss_fn, acc: Accumulator, params, rest, batch):
    new, new_rest, metrics = fwd_bwd(graph, loss_fn, params, rest, batch)
    return accumulate(acc, new), new_rest, metrics


def apply_update(tx: optax.GradientTransformation, cfg: UpdateConfig, params: nnx.State,
                 opt_state, step: jax.Array, acc: Accumulator):
    """One optimizer step from the accumulated sums; skipped if the step loss is not finite.

    Returns (params, opt_state, step, finite). `step` counts applied updates and is the
    scalar the host throttles on.
    """
    # One scalar divide; every gradient element then takes one multiply. Zero when no token
    # carried loss weight (a 0/0 step applies a zero gradient instead of NaNs).
    inv_denominator = jnp.where(acc.denominator > 0, 1.0 / acc.denominator, 0.0)
    grads = jax.tree.map(
        lambda g, p: (g * inv_denominator).astype(cfg.grad_dtype or p.dtype), acc.grads, params)
    if cfg.clip_threshold is not None:
        grads, _ = optax.clip_by_global_norm(cfg.clip_threshold).update(grads, optax.EmptyState())
    finite = jnp.isfinite(acc.loss_sum)
    updates, new_opt_state = tx.update(grads, opt_state, params)
    # A non-finite step keeps the old params and optimizer state. An elementwise select
    # fuses into the update's own loops; lax.cond would copy both states for its identity
    # branch (~40 MiB more on `small`) and can cost a device->host predicate read on GPU.
    keep_if_bad = lambda new, old: jnp.where(finite, new, old)
    new_params = jax.tree.map(keep_if_bad, optax.apply_updates(params, updates), params)
    new_opt_state = jax.tree.map(keep_if_bad, new_opt_state, opt_state)
    return new_params, new_opt_state, step + finite.astype(step.dtype), finite


def zeros_like_accumulator(params: nnx.State, shardings=None) -> Accumulator:
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
