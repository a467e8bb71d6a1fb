"""A test-only `native` arm with a planted regression: every gradient is replicated before
the optimizer sees it (XLA all-reduces the gradients instead of reduce-scattering them).
Loaded with `--plugin tests.harness.cell.planted`, it takes the name `native`, so its plans
compare with the real arm's cell by cell; never part of the product."""

import jax
import optax
from jax.sharding import PartitionSpec

from arms.native import NativeArm
from arms.registry import register


def replicate_gradients() -> optax.GradientTransformation:
    """Hands the optimizer every gradient whole on every device (the optimization barrier
    keeps XLA from folding the gather into the slice the sharded update takes of it)."""

    def update(updates, state, params=None):
        del params
        whole = jax.tree.map(lambda g: jax.lax.with_sharding_constraint(g, PartitionSpec()),
                             updates)
        return jax.lax.optimization_barrier(whole), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class ReplicatedGradientNative(NativeArm):
    def optimizer(self, tx=None):
        return optax.chain(replicate_gradients(), super().optimizer(tx))


register("native", lambda spec, **options: ReplicatedGradientNative(spec, "decoder", **options))
