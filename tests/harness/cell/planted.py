"""Test-only `native` arms, each with one planted difference. Loaded with `--plugin
tests.harness.cell.planted`, the chosen one takes the name `native`, so its plans compare
with the real arm's cell by cell; never part of the product. PARITY_PLANT picks it:

- `replicate-gradients` (the default): every gradient is replicated before the optimizer
  sees it (XLA all-reduces the gradients instead of reduce-scattering them);
- `gather`: the largest parameter is gathered whole on every device once per step, an
  extra all-gather of a parameter-sized buffer;
- `no-donate`: params are not donated to the step (PeftTrainer's way), so the new params
  are buffers of their own;
- `no-skip`: no non-finite skip (the update is not inside a conditional).
"""

import os

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from arms.native import NativeArm
from arms.registry import register

PLANT = "PARITY_PLANT"


def replicate_gradients() -> optax.GradientTransformation:
    """Hands the optimizer every gradient whole on every device (the optimization barrier
    keeps XLA from folding the gather into the slice the sharded update takes of it)."""

    def update(updates, state, params=None):
        del params
        whole = jax.tree.map(lambda g: jax.lax.with_sharding_constraint(g, PartitionSpec()),
                             updates)
        return jax.lax.optimization_barrier(whole), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def gather_largest_param() -> optax.GradientTransformation:
    """Gathers the largest parameter whole on every device and keeps it (an optimization
    barrier beside the gradients) until a scalar of it joins the first gradient: one
    all-gather of a parameter-sized buffer, the step's result unchanged (times zero)."""

    def update(updates, state, params=None):
        leaves, tree = jax.tree.flatten(updates)
        largest = max(jax.tree.leaves(params), key=lambda p: p.size)
        whole = jax.lax.with_sharding_constraint(largest, PartitionSpec())
        whole, leaves = jax.lax.optimization_barrier((whole, leaves))
        leaves[0] = leaves[0] + 0 * jnp.max(whole).astype(leaves[0].dtype)
        return jax.tree.unflatten(tree, leaves), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class PlantedTransform(NativeArm):
    transform = staticmethod(replicate_gradients)

    def optimizer(self):
        return optax.chain(self.transform(), super().optimizer())


class Gathered(PlantedTransform):
    transform = staticmethod(gather_largest_param)


class NotDonated(NativeArm):
    donate_argnums = (2,)


class NoSkip(NativeArm):
    skip_nonfinite = False


ARMS = {"replicate-gradients": PlantedTransform, "gather": Gathered, "no-donate": NotDonated,
        "no-skip": NoSkip}
_chosen = ARMS[os.environ.get(PLANT, "replicate-gradients")]
register("native", lambda spec, **options: _chosen(spec, "decoder", **options))
