"""The `native` arm: one jitted step (a lax.scan over micro-batches at GA > 1), nothing on
the host between micro-batches.

It is the straightforward way to train this model in JAX, written independently of the
engine: params and optimizer state donated, sum/sum normalization, clip, optax update, a
non-finite step skipped, and no host work between micro-batches. A yardstick the engine must
meet or beat, not a limit: XLA compiles its whole step as one program, which the engine can
beat where it splits the work better (on the TPU v5e at GA 4, docs/tpu-v5e.md).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from arms.abstract import ArmPlan, abstract_batch
from arms.base import Arm
from engine.model import (
    abstract_on,
    batch_sharding,
    named_shardings,
    optimizer_shardings,
    sharding_context,
)


def native_step(graph, loss_fn, tx, clip, params, rest, opt_state, batches, *,
                skip_nonfinite: bool = True):
    """(params, rest, opt_state, loss) after one optimizer step over `batches`.

    One micro-batch is differentiated directly; several are stacked and scanned, gradients
    summed in float32 in the carry. With `skip_nonfinite`, a step whose loss is not finite
    leaves the state as it was.
    """

    def micro_step(carry, batch):
        grads_sum, loss_sum, den_sum, rest = carry

        def objective(p):
            model = nnx.merge(graph, p, rest, copy=True)
            loss, den, _ = loss_fn(model, batch)
            return loss, (den, nnx.state(model, nnx.Not(nnx.Param)))

        (loss, (den, rest)), grads = jax.value_and_grad(objective, has_aux=True)(params)
        if grads_sum is None:
            grads_sum = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
        else:
            grads_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grads_sum, grads)
        return (grads_sum, loss_sum + loss, den_sum + den, rest), None

    zero = jnp.float32(0)
    if len(batches) == 1:  # nothing to accumulate: no stack, no loop, no zero-filled carry
        (grads, loss_sum, den, rest), _ = micro_step((None, zero, zero, rest), batches[0])
    else:
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *batches)
        zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        (grads, loss_sum, den, rest), _ = jax.lax.scan(micro_step, (zeros, zero, zero, rest),
                                                       stacked)
    scale = jnp.where(den > 0, 1.0 / den, 0.0)

    def update(params, opt_state):
        g = jax.tree.map(lambda g, p: (g * scale).astype(p.dtype), grads, params)
        if clip is not None:
            g, _ = optax.clip_by_global_norm(clip).update(g, optax.EmptyState())
        updates, opt_state = tx.update(g, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    # A step whose loss is not finite is skipped, as our engine does (PeftTrainer does not).
    # The skip keeps the old state until the loss is known, so at GA=1 the raw gradient
    # needs a param-sized buffer of its own before the update writes in place.
    if skip_nonfinite:
        params, opt_state = jax.lax.cond(jnp.isfinite(loss_sum), update, lambda p, o: (p, o),
                                         params, opt_state)
    else:
        params, opt_state = update(params, opt_state)
    return params, rest, opt_state, loss_sum * scale


class NativeArm(Arm):
    trainer = "native"
    donate_argnums: tuple[int, ...] = (0, 2)
    """The step's arguments whose buffers it may overwrite: params and optimizer state."""
    skip_nonfinite: bool = True
    """Skip a step whose loss is not finite (native_step)."""

    def _lower(self, model, start_state) -> tuple[jax.stages.Lowered, tuple]:
        """(lowered step, (params, rest, opt_state)) for `model`, real or abstract;
        `start_state(tx, (params, rest), (param_sh, rest_sh, opt_sh))` gives the params,
        non-Param state and optimizer state the step starts from (arrays, or their shapes)."""
        spec = self.spec
        graph, params, rest = nnx.split(model, nnx.Param, ...)
        tx, loss_fn, clip = self.optimizer(), spec.loss_fn(), spec.clip
        param_sh = named_shardings(params, self.mesh, self.rules)
        rest_sh = named_shardings(rest, self.mesh, self.rules)
        opt_sh = optimizer_shardings(tx, params, param_sh, self.mesh)
        with sharding_context(self.mesh, self.rules):
            params, rest, opt_state = start_state(tx, (params, rest), (param_sh, rest_sh, opt_sh))
        batch_sh = batch_sharding(self.mesh)
        example = abstract_batch(spec, batch_sh)
        scalar = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec())

        def step(params, rest, opt_state, batches):
            return native_step(graph, loss_fn, tx, clip, params, rest, opt_state, batches,
                               skip_nonfinite=self.skip_nonfinite)

        jitted = jax.jit(step, donate_argnums=self.donate_argnums,
                         in_shardings=(param_sh, rest_sh, opt_sh,
                                       (jax.tree.map(lambda _: batch_sh, example),) * spec.ga),
                         out_shardings=(param_sh, rest_sh, opt_sh, scalar))
        with sharding_context(self.mesh, self.rules):
            lowered = jitted.lower(params, rest, opt_state, (example,) * spec.ga)
        return lowered, (params, rest, opt_state)

    def build(self) -> None:
        self.model = self.build_model()

        def materialized(tx, state, shardings):
            params, rest = state
            return params, rest, jax.jit(tx.init, out_shardings=shardings[2])(params)

        lowered, self.state = self._lower(self.model, materialized)
        start = time.perf_counter()
        self.compiled = lowered.compile()
        self.compile_seconds = time.perf_counter() - start
        self._loss = None

    def plan(self) -> ArmPlan:
        def shapes(tx, state, shardings):
            params, rest = abstract_on(state, shardings[:2])
            return params, rest, jax.eval_shape(jax.jit(tx.init, out_shardings=shardings[2]),
                                                params)

        lowered, (params, rest, opt_state) = self._lower(self.build_abstract_model(), shapes)
        return ArmPlan(executables={"step": lowered}, calls_per_step={"step": 1},
                       state={"params": params, "opt_state": opt_state, "rest": rest})

    def step(self, micro_batches):
        params, rest, opt_state = self.state
        with sharding_context(self.mesh, self.rules):
            params, rest, opt_state, self._loss = self.compiled(params, rest, opt_state,
                                                                tuple(micro_batches))
        self.state = (params, rest, opt_state)
        self._executions = 1
        return params

    def executables(self):
        return {"step": self.compiled}

    def opt_state(self):
        return self.state[2]

    def last_loss(self) -> float:
        return float(self._loss)
