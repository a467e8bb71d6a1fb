"""MaxText's own Qwen3 (package `maxtext`), built through MaxText's config system, behind our
decoder's call; weight conversion both ways between it and our MaxText-style decoder.

The model is the real one: `pyconfig.initialize` on MaxText's `base.yml` with
`model_name=qwen3-0.6b` (its Qwen3 knobs: qk-norm, RoPE 1e6, RMSNorm eps 1e-6) and our
preset's dimensions as overrides, then `model_creation_utils.from_config(..., rngs=...)`, the
NNX `Transformer`. Its logical axis rules are MaxText's own (`config.logical_axis_rules`), on
a mesh with MaxText's twelve axis names whose data/fsdp/tensor sizes are the cell's.

Known, upstream difference (maxtext 0.2.5): with tied embeddings the output head
(`attend_on_embedding`) casts the embedding table to bfloat16 before the logits matmul, whatever
`dtype` says, so tied MaxText logits differ from a float32 decoder's by ~1e-3 (relative). It is
run as shipped; `bf16_head_decoder` reproduces the cast on our decoder to prove the cause.

`maxtext` is imported only when a maxtext model is built (on Python 3.11 and jax 0.10.2
through the shims of arms.models.maxtext_compat), and a missing or broken install raises one
ImportError naming the fix, so only the maxtext arms fail.
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.linen import spmd as linen_spmd
from jax.sharding import AxisType, Mesh

from arms.models import check_own_computation, compiled_module
from arms.models.paths import array_module, get_path, set_path
from engine.model import Decoder, DecoderConfig, build_decoder
from engine.model.sharding import MESH_AXES, abstract_on, check_fits, named_shardings

INSTALL_HINT = ("the maxtext arms need the `maxtext` package and what its model and engine "
                "import (`make` installs them; an offline host: docs/install.md)")

MODEL_NAME = "qwen3-0.6b"
"""MaxText model file the Qwen3 knobs come from; every dimension is overridden."""

REMAT_POLICIES = {"minimal": "minimal", "full": "full"}
"""Our remat option -> MaxText's `remat_policy` ('none' has no equivalent: check_expressible)."""


def require_maxtext(*, engine: bool = False):
    """The `maxtext` modules this project uses (`engine`: also MaxText's training engine,
    after the Tunix datatypes it imports), or one ImportError that names the fix. The shims
    of arms.models.maxtext_compat that this Python and JAX need are applied first."""
    from arms.models import maxtext_compat

    maxtext_compat.install()
    try:
        from maxtext.configs import pyconfig
        from maxtext.utils import maxtext_utils, model_creation_utils

        if engine:
            from arms.models.tunix_datatypes import install

            install()
            from maxtext.training_engine import abstract_engine, maxtext_engine

            return abstract_engine, maxtext_engine
    except (ImportError, SyntaxError) as err:  # missing, broken, or newer Python's syntax
        raise ImportError(f"{INSTALL_HINT}; importing it failed: {type(err).__name__}: "
                          f"{err}") from err
    return pyconfig, maxtext_utils, model_creation_utils


def run_root() -> str:
    """This process's MaxText run directory (MaxText writes an empty `parity/checkpoints`
    there): `<temp dir>/parity-maxtext-<uid>/<pid>`, removed at exit. A cell worker forked by
    the zygote leaves by `os._exit`, which runs no exit handler, so the first call in each
    process also removes the directories of processes no longer running."""
    pid = os.getpid()
    if pid in _RUN_ROOTS:
        return _RUN_ROOTS[pid]
    parent = os.path.join(tempfile.gettempdir(), f"parity-maxtext-{os.getuid()}")
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        if name.isdigit() and not _running(int(name)):
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    path = os.path.join(parent, str(pid))
    os.makedirs(path, exist_ok=True)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    _RUN_ROOTS[pid] = path
    return path


_RUN_ROOTS: dict[int, str] = {}
"""pid -> its run directory (a forked child makes its own)."""


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def check_expressible(config: DecoderConfig) -> None:
    """Raises one ValueError if MaxText's Qwen3 cannot compute what `config` describes.

    MaxText 0.2.5 wraps every decoder layer in `jax.checkpoint(policy=...)`, scanned or not
    (`maxtext/layers/nnx_decoders.py`), and its `remat_policy` 'none' gives a policy of None:
    save nothing, i.e. full rematerialization. So "no remat" has no MaxText equivalent: a
    MaxText arm asked for it would recompute every layer's forward in the backward pass while
    the arms on our decoder do not, and the comparison would not be of the same work.
    """
    if config.remat == "none":
        raise ValueError("MaxText's decoder always rematerializes (it wraps every layer in "
                         "jax.checkpoint; remat_policy 'none' there is full remat), so "
                         "remat=none cannot be expressed; use --remat full (the same work "
                         "as MaxText's 'none') or --remat minimal for the maxtext arms")
    if config.remat not in REMAT_POLICIES:
        raise ValueError(f"remat={config.remat!r} has no MaxText remat_policy; valid: "
                         f"{', '.join(REMAT_POLICIES)}")
    check_own_computation(config, "MaxText")


def maxtext_config(config: DecoderConfig, *, mesh_shape: dict[str, int] | None = None,
                   seq: int = 32, platform: str | None = None, **overrides: Any):
    """MaxText's `HyperParameters` for our `config`: base.yml + qwen3 + our dimensions.

    `mesh_shape` gives the ici data/fsdp/tensor sizes (every other MaxText axis is 1);
    `platform` is the one the model is compiled for (default: JAX's backend; a plan for a
    TPU topology passes "tpu");
    `overrides` are further MaxText keys (e.g. the optimizer's, for its training engine).
    Nothing is written outside a temp dir: no compile cache, profile, checkpoint or goodput.
    """
    pyconfig, _, _ = require_maxtext()
    check_expressible(config)
    sizes = {**dict.fromkeys(MESH_AXES, 1), **(mesh_shape or {})}
    base_yml = os.path.join(os.path.dirname(pyconfig.__file__), "base.yml")
    settings = dict(
        model_name=MODEL_NAME, override_model_config=True,
        base_emb_dim=config.embed_dim, base_num_query_heads=config.num_heads,
        base_num_kv_heads=config.num_kv_heads, head_dim=config.head_dim,
        base_mlp_dim=config.mlp_dim, base_num_decoder_layers=config.num_layers,
        vocab_size=config.vocab_size, rope_max_timescale=int(config.rope_theta),
        normalization_layer_epsilon=config.norm_eps,
        logits_via_embedding=config.tie_embeddings,
        dtype=config.dtype, weight_dtype=config.param_dtype,
        scan_layers=config.scan_layers, remat_policy=REMAT_POLICIES[config.remat],
        max_target_length=seq, per_device_batch_size=1,
        ici_data_parallelism=sizes["data"], ici_fsdp_parallelism=sizes["fsdp"],
        ici_tensor_parallelism=sizes["tensor"], dcn_data_parallelism=1,
        hardware=_HARDWARE.get(platform or jax.default_backend(), "tpu"),
        attention="dot_product", dropout_rate=0.0,
        enable_checkpointing=False, run_name="parity",
        base_output_directory=run_root(),
        dataset_type="synthetic", skip_jax_distributed_system=True, log_config=False,
        jax_cache_dir="", profiler="", profiler_steps=0,
        enable_goodput_recording=False, monitor_goodput=False,
    )
    settings.update(overrides)
    # MaxText's config validation sets XLA_FLAGS to its HLO-dump flags (--xla_dump_to=...)
    # whenever XLA_FLAGS is empty, even with dump_hlo off: it would change the environment
    # every later record and subprocess sees (and dump HLO where a backend starts after it).
    flags = os.environ.get("XLA_FLAGS")
    try:
        return pyconfig.initialize(["parity", base_yml], **settings)
    finally:
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags


_HARDWARE = {"cpu": "cpu", "gpu": "gpu", "cuda": "gpu", "rocm": "gpu"}
"""JAX platform -> MaxText's `hardware` (anything else is a TPU)."""


def mesh_platform(mesh: Mesh) -> str:
    """The platform of `mesh`'s devices ("tpu" for a topology's compile-only devices)."""
    return mesh.devices.flat[0].platform


def maxtext_mesh(mesh: Mesh, mx_config) -> Mesh:
    """`mesh`'s devices under MaxText's axis names: data/fsdp/tensor as in `mesh`, others 1."""
    names = tuple(mx_config.mesh_axes)
    shape = tuple(mesh.shape.get(name, 1) for name in names)
    devices = np.asarray(mesh.devices).reshape(shape)
    return Mesh(devices, names, axis_types=(AxisType.Auto,) * len(names))


def rules(mx_config) -> tuple:
    """MaxText's logical axis rules from its config (used to lay out and run its model)."""
    return tuple(mx_config.logical_axis_rules)


def check_shardable(model: nnx.Module, mesh: Mesh, mx_config) -> None:
    """Raises one ValueError if MaxText's rules would split a parameter unevenly on `mesh`.

    Resolved on the (abstract or real) parameter shapes before anything compiles; XLA's own
    error for an indivisible sharding names neither the parameter nor the fix.
    """
    state = nnx.state(model, nnx.Param)
    logical = dict(nnx.get_partition_spec(state).flat_state())
    for path, variable in state.flat_state():
        spec = linen_spmd.logical_to_mesh_axes(tuple(logical[path].get_value()),
                                               rules(mx_config))
        shape = variable.get_value().shape
        for dim, axes in zip(shape, spec, strict=False):
            names = axes if isinstance(axes, tuple) else (axes,) if axes else ()
            split = math.prod(mesh.shape[n] for n in names)
            if dim % split:
                raise ValueError(
                    f"MaxText's logical axis rules split {'/'.join(map(str, path))} (shape "
                    f"{tuple(shape)}) over mesh axes {'x'.join(names)} = {split} ways, which "
                    f"does not divide {dim}; pick a mesh whose {'x'.join(names)} size divides "
                    f"{dim}")


class MaxTextDecoder(nnx.Module):
    """MaxText's NNX `Transformer` behind our decoder's call: (tokens, positions, segment_ids)
    -> float32 logits. Dropout is off (rate 0 and `enable_dropout=False`). It carries the
    layout it runs under: MaxText's config (whose logical axis rules apply) and mesh."""

    def __init__(self, config: DecoderConfig, transformer: nnx.Module, mx_config,
                 mx_mesh: Mesh):
        self.config, self.mx_config, self.mx_mesh = config, mx_config, mx_mesh
        self.transformer = transformer

    def __call__(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
                 segment_ids_BxL: jax.Array) -> jax.Array:
        return call_transformer(self.transformer, tokens_BxL, positions_BxL, segment_ids_BxL)


class TransformerCall(nnx.Module):
    """MaxText's `Transformer` behind our decoder's call, in the layout it is already under
    (the model a MaxText trainer hands its loss)."""

    def __init__(self, transformer: nnx.Module):
        self.transformer = transformer

    def __call__(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
                 segment_ids_BxL: jax.Array) -> jax.Array:
        return call_transformer(self.transformer, tokens_BxL, positions_BxL, segment_ids_BxL)


def call_transformer(transformer, tokens_BxL, positions_BxL, segment_ids_BxL) -> jax.Array:
    """logits_BxLxV (float32) of a MaxText `Transformer` on one packed micro-batch."""
    logits_BxLxV = transformer(tokens_BxL, positions_BxL, segment_ids_BxL, enable_dropout=False)
    return logits_BxLxV.astype(jnp.float32)


# ---------------------------------------------------------------------------- conversion
def _layer_pairs():
    """(our path inside a block, MaxText's path inside a decoder layer) per block parameter.

    MaxText's `post_self_attention_layer_norm` is the pre-MLP norm (it normalizes the
    residual after attention, before the MLP): our `pre_mlp_norm`. No kernel is transposed.
    """
    return (
        (("pre_attention_norm", "scale"), ("pre_self_attention_layer_norm", "scale")),
        (("attention", "query"), ("self_attention", "query", "kernel")),
        (("attention", "key"), ("self_attention", "key", "kernel")),
        (("attention", "value"), ("self_attention", "value", "kernel")),
        (("attention", "out"), ("self_attention", "out", "kernel")),
        (("attention", "query_norm", "scale"), ("self_attention", "query_norm", "scale")),
        (("attention", "key_norm", "scale"), ("self_attention", "key_norm", "scale")),
        (("pre_mlp_norm", "scale"), ("post_self_attention_layer_norm", "scale")),
        (("mlp", "wi_0"), ("mlp", "wi_0", "kernel")),
        (("mlp", "wi_1"), ("mlp", "wi_1", "kernel")),
        (("mlp", "wo"), ("mlp", "wo", "kernel")),
    )


SCAN_AXIS = 1
"""MaxText stacks scanned layers on axis 1 (`param_scan_axis`); our decoder on axis 0."""


def decoder_to_maxtext_params(ours: dict, config: DecoderConfig) -> dict:
    """Our decoder's Params (pure dict) in MaxText's Transformer layout for `config`."""
    theirs: dict = {}
    set_path(theirs, ("token_embedder", "embedding"), ours["embedding"])
    set_path(theirs, ("decoder", "decoder_norm", "scale"), ours["final_norm"]["scale"])
    if not config.tie_embeddings:
        set_path(theirs, ("decoder", "logits_dense", "kernel"), ours["head"])
    for our_path, their_path in _layer_pairs():
        if config.scan_layers:
            stacked = get_path(ours["layers"], our_path)
            set_path(theirs, ("decoder", "layers", *their_path),
                     jnp.moveaxis(stacked, 0, SCAN_AXIS))
        else:
            for i in range(config.num_layers):
                set_path(theirs, ("decoder", f"layers_{i}", *their_path),
                     get_path(ours["layers"][i], our_path))
    return theirs


def maxtext_to_decoder_params(theirs: dict, config: DecoderConfig) -> dict:
    """MaxText Transformer Params (pure dict, scanned or not) in our layout for `config`."""
    ours: dict = {"embedding": theirs["token_embedder"]["embedding"],
                  "final_norm": {"scale": theirs["decoder"]["decoder_norm"]["scale"]}}
    if not config.tie_embeddings:
        ours["head"] = theirs["decoder"]["logits_dense"]["kernel"]
    scanned = "layers" in theirs["decoder"]
    for our_path, their_path in _layer_pairs():
        if scanned:
            stacked = get_path(theirs["decoder"]["layers"], their_path)
            values = list(array_module(stacked).moveaxis(stacked, SCAN_AXIS, 0))
        else:
            values = [get_path(theirs["decoder"][f"layers_{i}"], their_path)
                      for i in range(config.num_layers)]
        if config.scan_layers:
            set_path(ours, ("layers", *our_path), array_module(values[0]).stack(values))
        else:
            for i, value in enumerate(values):
                set_path(ours, ("layers", i, *our_path), value)
    return ours


def write_params(model: nnx.Module, pure: dict) -> None:
    """Writes `pure` into `model`'s Params in place, each value in its variable's dtype and
    on its variable's own sharding: a model MaxText laid out keeps MaxText's layout (the one
    its ahead-of-time engine plans, so the plan's programs are the ones that run)."""
    params = nnx.state(model, nnx.Param)
    current = nnx.to_pure_dict(params)
    nnx.replace_by_pure_dict(params, jax.tree.map(
        lambda new, old: jax.device_put(jnp.asarray(new, old.dtype), old.sharding), pure,
        current))
    nnx.update(model, params)


def load_params(model: nnx.Module, pure: dict, mesh: Mesh, mx_config) -> None:
    """Writes `pure` into `model`'s Params and lays every variable on `mesh` by MaxText's
    rules, in place."""
    write_params(model, pure)
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, named_shardings(state, mesh, rules(mx_config))))


def build_transformer(config: DecoderConfig, mesh: Mesh | None = None, *, seq: int = 32,
                      mx_config=None):
    """(MaxText Transformer, its config, its mesh) for `config` on `mesh`'s devices."""
    _, _, model_creation_utils = require_maxtext()
    if mesh is None:
        mesh = jax.make_mesh((1,) * len(MESH_AXES), MESH_AXES,
                             axis_types=(AxisType.Auto,) * len(MESH_AXES),
                             devices=jax.devices()[:1])
    check_fits(config, mesh)
    mx_config = mx_config or maxtext_config(config, mesh_shape=dict(mesh.shape), seq=seq)
    mx_mesh = maxtext_mesh(mesh, mx_config)
    def create():
        return model_creation_utils.from_config(mx_config, mesh=mx_mesh,
                                                rngs=nnx.Rngs(params=0, dropout=1))

    abstract = nnx.eval_shape(create)
    check_shardable(abstract, mx_mesh, mx_config)
    transformer = compiled_module(create, abstract)
    return transformer, mx_config, mx_mesh


def abstract_maxtext(config: DecoderConfig, mesh: Mesh, *, seq: int = 32) -> MaxTextDecoder:
    """MaxText's Transformer for `config` as shapes on `mesh`'s devices (MaxText's mesh and
    rules, as `build_transformer` lays out real weights); nothing is allocated."""
    _, _, model_creation_utils = require_maxtext()
    check_fits(config, mesh)
    mx_config = maxtext_config(config, mesh_shape=dict(mesh.shape), seq=seq,
                               platform=mesh_platform(mesh))
    mx_mesh = maxtext_mesh(mesh, mx_config)
    abstract = nnx.eval_shape(lambda: model_creation_utils.from_config(
        mx_config, mesh=mx_mesh, rngs=nnx.Rngs(params=0, dropout=1)))
    check_shardable(abstract, mx_mesh, mx_config)
    graph, state = nnx.split(abstract)
    transformer = nnx.merge(graph, abstract_on(state, named_shardings(state, mx_mesh,
                                                                       rules(mx_config))))
    return MaxTextDecoder(config, transformer, mx_config, mx_mesh)


def to_maxtext(decoder: Decoder, mesh: Mesh | None = None, *, seq: int = 32) -> MaxTextDecoder:
    """A MaxTextDecoder holding exactly `decoder`'s weights, laid out by MaxText's rules."""
    transformer, mx_config, mx_mesh = build_transformer(decoder.config, mesh, seq=seq)
    load_params(transformer, decoder_to_maxtext_params(
        nnx.to_pure_dict(nnx.state(decoder, nnx.Param)), decoder.config), mx_mesh, mx_config)
    return MaxTextDecoder(decoder.config, transformer, mx_config, mx_mesh)


def from_maxtext(model: MaxTextDecoder, config: DecoderConfig) -> Decoder:
    """Our Decoder (layout per `config`) holding `model`'s weights."""
    decoder = build_decoder(config)
    state = nnx.state(decoder, nnx.Param)
    nnx.replace_by_pure_dict(state, maxtext_to_decoder_params(
        nnx.to_pure_dict(nnx.state(model.transformer, nnx.Param)), config))
    nnx.update(decoder, state)
    return decoder


def bf16_head_decoder(decoder: Decoder) -> Decoder:
    """An untied copy of a tied `decoder` whose head is the bfloat16-rounded embedding.

    This is what maxtext 0.2.5's tied head computes (`attend_on_embedding` casts the table
    to bfloat16; the input lookup stays float32): matching it proves the cause of the gap.
    """
    config = decoder.config
    if not config.tie_embeddings:
        raise ValueError("bf16_head_decoder needs a tied decoder")
    pure = nnx.to_pure_dict(nnx.state(decoder, nnx.Param))
    head = jnp.asarray(pure["embedding"]).astype(jnp.bfloat16).astype(jnp.float32).T
    untied = build_decoder(config.replace(tie_embeddings=False))
    state = nnx.state(untied, nnx.Param)
    nnx.replace_by_pure_dict(state, {**pure, "head": head})
    nnx.update(untied, state)
    return untied
