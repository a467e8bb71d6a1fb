"""What an arm hands the planner: its executables lowered for a mesh from shapes alone.

An arm plans (`Arm.plan`) through its own code path, on a model whose variables are shapes
laid out on the target mesh (`abstract_model`): our engine's kernels, the native step,
MaxText's engine through its own ahead-of-time class, PeftTrainer's own jitted train step.
Nothing is allocated, so a `qwen3-8b` cell plans on a small host. What comes back is an
`ArmPlan`: the executables (lowered; the planner compiles them), how often a step calls
each, the train state that stays in device memory between them, and which of that state
each executable leaves outside its arguments (it is in memory while the executable runs,
but not in its memory analysis).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from arms.spec import CellSpec


@dataclasses.dataclass(frozen=True, kw_only=True)
class ArmPlan:
    """One arm's step, compiled for a mesh it never runs on."""

    executables: dict[str, jax.stages.Lowered]
    """Every executable a step runs (and those it may run: MaxText's accumulating kernel at
    GA 1, with 0 calls), lowered for the mesh: the planner compiles those with calls."""
    calls_per_step: dict[str, int]
    """Calls of each executable per optimizer step."""
    state: dict[str, Any]
    """Train state held in device memory between executables, by part ("params",
    "opt_state", "accumulator", "rest"): trees of `jax.ShapeDtypeStruct` with shardings."""
    held: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Executable -> the parts of `state` that stay in memory while it runs without being
    its arguments (e.g. the optimizer moments during a split fwd/bwd); none for a step that
    takes the whole state."""
    compiler_options: dict[str, Any] | None = None
    """XLA options the trainer compiles its executables with (None: XLA's defaults)."""


def bytes_per_device(tree) -> int:
    """Bytes one device holds of `tree` (arrays, or shapes with shardings): each leaf's
    shard, a leaf without a sharding (or replicated) whole."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        shape = sharding.shard_shape(leaf.shape) if sharding is not None else leaf.shape
        total += math.prod(shape) * leaf.dtype.itemsize  # a PRNG key's too (key<fry>: 8)
    return total


def bytes_held(held: dict[str, tuple[str, ...]], part_bytes: dict[str, int]) -> dict[str, int]:
    """Executable -> the bytes one device holds of the train-state parts `held` names for it
    (`ArmPlan.held`), from each part's bytes per device (`bytes_per_device`): what is in
    memory while it runs without being one of its arguments."""
    return {name: sum(part_bytes[part] for part in parts) for name, parts in held.items()}


def abstract_model(kind: str, spec: CellSpec, mesh: Mesh) -> nnx.Module:
    """The model of an arm as shapes on `mesh` (the same layout `arms.base.build_model` gives
    real weights): our decoder, MaxText's Qwen3 (on MaxText's mesh and rules, as
    `model_layout` reads them) or Tunix's Qwen3."""
    config = spec.model_config()
    if kind == "decoder":
        from engine.model import abstract_decoder

        return abstract_decoder(config, mesh)
    if kind == "maxtext":
        from arms.models.maxtext_qwen3 import abstract_maxtext

        return abstract_maxtext(config, mesh, seq=spec.seq)
    from arms.models.tunix_qwen3 import abstract_tunix

    return abstract_tunix(config, mesh)


def abstract_batch(spec: CellSpec, sharding: NamedSharding):
    """One micro-batch of `spec` as shapes, laid out by `sharding` (rows over the batch axes)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        spec.micro_batches(logprobs=False)[0])


def _rehome(x, mesh: Mesh):
    """`x` as a shape on `mesh`, with its partition spec; a value traced without one (a
    scalar such as the optimizer's step count) replicated, as an eager build places it (the
    plan then lowers the program the build compiles, to the annotation)."""
    spec = getattr(getattr(x, "sharding", None), "spec", None)
    return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                sharding=NamedSharding(mesh, spec or PartitionSpec()))


def traced_state(build: Callable[[Any], Any], state, mesh: Mesh):
    """`build(state)`'s output as shapes, each laid out as running `build` on arrays laid out
    like `state` would lay it out.

    For a trainer that creates its optimizer state eagerly (`nnx.Optimizer` runs `tx.init`,
    whose `zeros_like` gives each moment its parameter's sharding): run abstractly, JAX
    carries a value's sharding through an operation only on Explicit mesh axes, so `build`
    is traced on a copy of `mesh` with Explicit axes and the result re-homed on `mesh` (whose
    axis types decide what the compiled programs do). MaxText's own ahead-of-time engine
    observes its moments' layouts the same way.
    """
    explicit = Mesh(mesh.devices, mesh.axis_names,
                    axis_types=(AxisType.Explicit,) * len(mesh.axis_names))
    with jax.set_mesh(explicit):
        out = jax.eval_shape(build, jax.tree.map(lambda x: _rehome(x, explicit), state))
    return jax.tree.map(lambda x: _rehome(x, mesh), out)
