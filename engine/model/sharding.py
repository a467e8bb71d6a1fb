"""Logical axis rules, the mesh helper and the sharding utilities the decoder and engine share.

Parameters and activations are annotated with MaxText's *logical* axis names. A rules table
maps each logical name to mesh axes in priority order; flax resolves it (each mesh axis used
at most once per array). The rules live in a thread-local (`flax.core.spmd`), which is why
kernels must be traced *inside* `sharding_context` to carry the constraints.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence

import jax
import numpy as np
import optax
from flax import nnx
from flax.core import spmd as core_spmd
from flax.linen import spmd as linen_spmd
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from engine.model.config import DecoderConfig

MESH_AXES = ("data", "fsdp", "tensor")
"""Mesh axis names, outermost first: pure data parallel, fully-sharded data parallel, tensor."""

LogicalRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# MaxText's base.yml rules restricted to the mesh axes above, in its priority order.
LOGICAL_AXIS_RULES: LogicalRules = (
    ("activation_batch", ("data", "fsdp")),
    ("activation_heads", "tensor"),
    ("activation_kv_heads", "tensor"),
    ("activation_length", None),
    ("activation_norm_length", None),
    ("activation_embed", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_kv", "tensor"),
    ("activation_vocab", "tensor"),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("embed", "fsdp"),
    ("embed_vocab", "fsdp"),
    ("norm", "tensor"),
    ("layers", None),
    ("kv", None),
    # Mesh axis names map to themselves, so models annotated directly with mesh axes
    # (Tunix's Qwen3 ShardingConfig) lay out the same way under these rules.
    ("data", "data"),
    ("fsdp", "fsdp"),
    ("tensor", "tensor"),
)

BATCH_AXES = ("data", "fsdp")
"""Mesh axes the batch dimension is split over (`activation_batch`)."""


ALL_REMAINING = -1
"""A mesh size meaning "every device the other axes leave" (e.g. fsdp=-1 spans the slice)."""


def parse_mesh_spec(spec: str | Mapping[str, int] | None,
                    device_count: int | None = None) -> dict[str, int]:
    """'fsdp=4,tensor=2' (or a mapping) -> {'data': 1, 'fsdp': 4, 'tensor': 2}.

    One axis may be -1: all remaining devices. With `device_count` it is resolved (the other
    axes' product must divide the count); without, it stays -1 (the spec is only checked).
    """
    shape = dict.fromkeys(MESH_AXES, 1)
    if not spec:
        return shape
    usage = "write it as NAME=SIZE[,NAME=SIZE], e.g. 'fsdp=4,tensor=2' or 'fsdp=-1'"
    items = spec.items() if isinstance(spec, Mapping) else (
        part.split("=", 1) for part in spec.split(","))
    given = set()
    for item in items:
        if len(item) != 2:
            raise ValueError(f"bad mesh spec {spec!r}; {usage}")
        name, text = item[0].strip(), str(item[1]).strip()
        if name not in MESH_AXES:
            raise ValueError(f"unknown mesh axis {name!r} in {spec!r}; valid axes: "
                             f"{', '.join(MESH_AXES)}")
        if name in given:
            raise ValueError(f"mesh axis {name!r} is given twice in {spec!r}; give each axis "
                             "once")
        given.add(name)
        try:
            size = int(text)
        except ValueError:
            raise ValueError(f"mesh axis {name}={text!r} in {spec!r}: a size is a positive "
                             "integer, or -1 for all remaining devices") from None
        if size < 1 and size != ALL_REMAINING:
            raise ValueError(f"mesh axis {name}={size} must be >= 1, or -1 for all remaining "
                             "devices")
        shape[name] = size
    free = [name for name, size in shape.items() if size == ALL_REMAINING]
    if len(free) > 1:
        raise ValueError(f"mesh {spec!r} has {len(free)} axes of size -1; at most one axis "
                         "can take all remaining devices")
    if free and device_count is not None:
        fixed = math.prod(size for size in shape.values() if size != ALL_REMAINING)
        if device_count % fixed:
            raise ValueError(f"mesh {spec!r}: the other axes ({fixed} devices) do not divide "
                             f"the {device_count} devices; give explicit sizes")
        shape[free[0]] = device_count // fixed
    return shape


def make_mesh(spec: str | Mapping[str, int] | None = None,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ('data', 'fsdp', 'tensor') mesh with Auto axis types.

    Auto axes are what `with_sharding_constraint`-style models (ours and Tunix's) need;
    `jax.make_mesh` would otherwise default to Explicit axes. Without `devices`, the mesh
    takes the first `prod(shape)` devices, so a 1-device mesh works on any host; a -1 axis
    takes every device the others leave.
    """
    available = list(devices) if devices is not None else jax.devices()
    shape = parse_mesh_spec(spec, len(available))
    need = math.prod(shape.values())
    if need > len(available):
        raise ValueError(
            f"mesh {shape} needs {need} devices but {len(available)} are available; shrink the "
            "mesh, or on CPU set XLA_FLAGS=--xla_force_host_platform_device_count=N "
            "before jax is imported")
    return jax.make_mesh(tuple(shape.values()), MESH_AXES,
                         axis_types=(AxisType.Auto,) * len(MESH_AXES),
                         devices=available[:need])


@contextlib.contextmanager
def sharding_context(mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> Iterator[None]:
    """Mesh + logical-axis rules, entered around tracing/lowering and calling kernels."""
    with jax.set_mesh(mesh), core_spmd.logical_axis_rules(rules):
        yield


def constrain(x: jax.Array, logical_axes: tuple[str | None, ...]) -> jax.Array:
    """Sharding constraint by logical names; a no-op unless traced under rules and a mesh."""
    return linen_spmd.with_logical_constraint(x, logical_axes)


def logical_specs(tree):
    """PartitionSpecs of logical names for a tree of nnx Variables (state or abstract state)."""
    return nnx.get_partition_spec(tree)


def logical_names(tree):
    """`logical_specs` of `tree` as logical names whatever rules are in force (what
    `constrain` and `named_shardings` resolve)."""
    with core_spmd.logical_axis_rules(()):
        return logical_specs(tree)


def named_shardings(tree, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES):
    """NamedShardings on `mesh` for every Variable in `tree`, resolved through `rules`."""
    return linen_spmd.logical_to_mesh_sharding(logical_names(tree), mesh, rules)


def optimizer_shardings(tx, params, param_shardings, mesh: Mesh):
    """Shardings of `tx.init(params)`: every param-shaped leaf (moments, captured gradients)
    sharded like its param, everything else (step counts) replicated.

    Left to XLA, `jit(tx.init)` returns state built from constants (zeros of a shape)
    replicated on every device: each device would then hold and update the whole
    optimizer state, and the update would gather the sharded gradients to match it.
    """
    replicated = NamedSharding(mesh, PartitionSpec())
    return optax.tree_map_params(tx, lambda _, sharding: sharding,
                                 jax.eval_shape(tx.init, params), param_shardings,
                                 transform_non_params=lambda _: replicated)


def shard_model(model: nnx.Module, mesh: Mesh, rules: LogicalRules = LOGICAL_AXIS_RULES) -> None:
    """Places every variable of `model` on `mesh` per its logical annotations, in place."""
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, named_shardings(state, mesh, rules)))


def on_mesh(tree, mesh: Mesh):
    """`tree` with every NamedSharding (bare, or of a ShapeDtypeStruct) moved to `mesh`, same
    specs: the same program laid out over other devices of the same mesh shape, such as a
    TPU topology's compile-only devices."""
    def move(x):
        if isinstance(x, NamedSharding):
            return NamedSharding(mesh, x.spec)
        if isinstance(x, jax.ShapeDtypeStruct) and isinstance(x.sharding, NamedSharding):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=move(x.sharding))
        return x
    return jax.tree.map(move, tree,
                        is_leaf=lambda x: isinstance(x, (NamedSharding, jax.ShapeDtypeStruct)))


def abstract_on(tree, shardings):
    """`tree` as `jax.ShapeDtypeStruct`s (same shapes and dtypes) laid out by `shardings`:
    the train state of a program that is compiled but never run (a plan for a target whose
    devices this host does not have). Nothing is allocated."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                        tree, shardings)


def is_abstract(tree) -> bool:
    """Whether `tree` holds shapes only (`jax.ShapeDtypeStruct`), no arrays."""
    leaves = jax.tree.leaves(tree)
    return bool(leaves) and all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Sharding of a [batch, ...] input: batch over the data-parallel axes, rest replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def check_fits(config: DecoderConfig, mesh: Mesh | Mapping[str, int],
               batch_size: int | None = None) -> None:
    """Raises one clear ValueError if `config` (and `batch_size`) cannot be laid on `mesh`.

    Run before any compile: XLA's own messages for an indivisible sharding name neither the
    model field nor the fix.
    """
    sizes = dict(mesh.shape) if isinstance(mesh, Mesh) else parse_mesh_spec(mesh)
    sizes = {k: 1 if v == ALL_REMAINING else v for k, v in sizes.items()}  # not known yet
    tensor, fsdp = sizes.get("tensor", 1), sizes.get("fsdp", 1)
    by_tensor = {"num_kv_heads": config.num_kv_heads, "num_heads": config.num_heads,
                 "mlp_dim": config.mlp_dim, "vocab_size": config.vocab_size,
                 "embed_dim": config.embed_dim, "head_dim": config.head_dim}
    for name, value in by_tensor.items():
        if value % tensor:
            raise ValueError(
                f"mesh tensor={tensor} cannot split {name}={value}"
                + (" (more tensor shards than kv heads)" if name == "num_kv_heads"
                   and tensor > value else "")
                + f"; use a tensor size that divides {value}")
    if config.embed_dim % fsdp:
        raise ValueError(f"mesh fsdp={fsdp} cannot split embed_dim={config.embed_dim}; "
                         f"use an fsdp size that divides {config.embed_dim}")
    if batch_size is not None:
        batch_shards = math.prod(sizes.get(a, 1) for a in BATCH_AXES)
        if batch_size % batch_shards:
            raise ValueError(
                f"micro-batch size {batch_size} is not divisible by the mesh's batch axes "
                f"(data x fsdp = {batch_shards}); use a batch that is a multiple of "
                f"{batch_shards} or a smaller data/fsdp mesh")


def place_global_batch(batch, shardings):
    """Host micro-batch (the *global* rows, identical on every process) -> global arrays.

    One process: a plain transfer. Several (jax.distributed): each process contributes
    only its own block of rows (process i holds rows [i*B/n, (i+1)*B/n), the order in which
    `make_mesh` lays devices out) through `jax.make_array_from_process_local_data`.
    """
    if isinstance(shardings, NamedSharding):  # one sharding for every leaf
        shardings = jax.tree.map(lambda _: shardings, batch)
    if jax.process_count() == 1:
        return jax.device_put(batch, shardings)
    count, index = jax.process_count(), jax.process_index()

    def local(x, sharding):
        x = np.asarray(x)
        rows = x.shape[0] // count
        return jax.make_array_from_process_local_data(
            sharding, x[index * rows:(index + 1) * rows], x.shape)

    return jax.tree.map(local, batch, shardings)
