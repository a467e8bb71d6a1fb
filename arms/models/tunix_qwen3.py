"""Tunix's Qwen3 (`tunix.models.qwen3.model.Qwen3`) on this project's mesh, and weight
conversion both ways between it and our MaxText-style decoder.

The conversion lives here, not in `engine/`, because the engine never imports tunix. Tunix
itself is imported when a model is built (`tunix_model`), so the harness can check what
Tunix's Qwen3 can express (`check_expressible`) without importing it.
"""

from __future__ import annotations

import jax
from flax import nnx
from jax.interpreters import pxla
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from arms.models import check_own_computation, compiled_module
from arms.models.paths import array_module, get_path, set_path
from engine.model import Decoder, DecoderConfig, attention_mask, build_decoder
from engine.model.sharding import abstract_on, check_fits

BATCH = ("data", "fsdp")


REMAT_CONFIGS = {"none": "NONE", "full": "DECODER"}
"""Our remat option -> Tunix's `RematConfig`. Our `full` recomputes each decoder layer from
its input (jax.checkpoint, nothing saved); Tunix's DECODER wraps the whole layer in
`nnx.remat` with JAX's default policy, which saves nothing: the same work. Our `minimal`
(matmul outputs saved) has no Tunix equivalent."""


def check_expressible(config: DecoderConfig) -> None:
    """Raises one ValueError if Tunix's Qwen3 cannot compute what `config` describes."""
    if config.remat not in REMAT_CONFIGS:
        raise ValueError(f"remat={config.remat!r} has no equivalent in Tunix's Qwen3 (its "
                         f"RematConfig remats a whole layer or nothing); use --remat "
                         f"{' or '.join(REMAT_CONFIGS)} for the tunix arms")
    check_own_computation(config, "Tunix")


def tunix_model():
    """`tunix.models.qwen3.model` (imported on first use), its activation constraints decided
    by the mesh a program is traced for (`shard_for_mesh`)."""
    from tunix.models.qwen3 import model

    model.shard = shard_for_mesh
    return model


def shard_for_mesh(x: jax.Array, spec: tuple) -> jax.Array:
    """Tunix's Qwen3 activation constraint (`model.shard`), applied where the mesh in scope
    is not of CPU devices.

    Tunix constrains an activation to `spec` under a mesh unless `jax.devices()[0]` is a CPU:
    in a TPU process the batch dimension of every activation is sharded over the batch axes
    (`act_btd`, ...); on CPU nothing is constrained. A plan traces for a TPU topology in a
    process whose default devices are CPUs, so Tunix's test would trace the CPU program for
    the TPU: activations left to XLA's propagation, which on an FSDP mesh replicates the
    batch on every device and all-reduces each layer's activations (qwen3-0.6b, seq 1024,
    batch 8, fsdp=8: a 10.3 GiB plan against 2.6 GiB for our decoder). Deciding by the
    mesh's devices is the same rule in every process whose mesh is of its default platform
    (CPU runs stay unconstrained, as in Tunix; TPU and GPU runs constrained), and the TPU
    program in a plan.
    """
    mesh = pxla.thread_resources.env.physical_mesh
    if mesh.empty or mesh.devices.flat[0].platform == "cpu":
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, PartitionSpec(*spec)))


def sharding_config():
    """Tunix's default FSDP x TP layout, spelled with our mesh axes (`fsdp`, `tensor`)."""
    return tunix_model().ShardingConfig(
        emb_vd=("tensor", "fsdp"), emb_dv=("fsdp", "tensor"),
        q_weight_dnh=("fsdp", "tensor", None), kv_weight_dnh=("fsdp", "tensor", None),
        o_weight_nhd=("tensor", None, "fsdp"),
        ffw_weight_df=("fsdp", "tensor"), ffw_weight_fd=("tensor", "fsdp"),
        rms_norm_weight=("tensor",),
        act_btd=(BATCH, None, "tensor"), act_btf=(BATCH, None, "tensor"),
        act_btnh=(BATCH, None, "tensor", None),
        exp_weight_edf=("fsdp", None, "tensor"), exp_weight_efd=("fsdp", "tensor", None))


def tunix_config(config: DecoderConfig):
    """Tunix's ModelConfig for the same architecture as `config`, remat included."""
    check_expressible(config)
    if config.rope_theta != 1_000_000:
        # Tunix's Attention calls apply_rope without its config's theta (always 1e6).
        raise ValueError(f"Tunix's Qwen3 applies RoPE with theta=1e6 whatever its config says; "
                         f"rope_theta={config.rope_theta} cannot be matched")
    tunix = tunix_model()
    return tunix.ModelConfig(
        num_layers=config.num_layers, vocab_size=config.vocab_size, embed_dim=config.embed_dim,
        hidden_dim=config.mlp_dim, num_heads=config.num_heads, head_dim=config.head_dim,
        num_kv_heads=config.num_kv_heads, rope_theta=int(config.rope_theta),
        norm_eps=config.norm_eps, use_tied_embedding=config.tie_embeddings,
        shd_config=sharding_config(), dtype=config.compute_dtype,
        param_dtype=config.storage_dtype,
        remat_config=tunix.RematConfig[REMAT_CONFIGS[config.remat]])


class TunixDecoder(nnx.Module):
    """Tunix's Qwen3 behind our decoder's call: (tokens, positions, segment_ids) -> logits.

    Tunix's non-flash attention ignores `segment_ids`, so the packed causal mask is built
    here and passed as its `attention_mask`; the same mask our decoder builds.
    """

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.qwen3 = tunix_model().Qwen3(tunix_config(config), rngs=rngs)

    def tunix_qwen3(self) -> nnx.Module:
        """Tunix's Qwen3 itself, for a loss that calls the model as Tunix does."""
        return self.qwen3

    def __call__(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
                 segment_ids_BxL: jax.Array) -> jax.Array:
        logits_BxLxV, _ = self.qwen3(tokens_BxL, positions_BxL, None,
                                     attention_mask(segment_ids_BxL))
        return logits_BxLxV


def _layer_pairs():
    """(our path inside a block, Tunix's path inside DecoderLayer) for every block parameter."""
    return (
        (("pre_attention_norm", "scale"), ("input_layernorm", "w")),
        (("attention", "query"), ("attn", "q_proj", "w")),
        (("attention", "key"), ("attn", "k_proj", "w")),
        (("attention", "value"), ("attn", "v_proj", "w")),
        (("attention", "out"), ("attn", "o_proj", "w")),
        (("attention", "query_norm", "scale"), ("attn", "q_norm", "w")),
        (("attention", "key_norm", "scale"), ("attn", "k_norm", "w")),
        (("pre_mlp_norm", "scale"), ("post_attention_layernorm", "w")),
        (("mlp", "wi_0"), ("mlp", "gate_proj", "kernel")),
        (("mlp", "wi_1"), ("mlp", "up_proj", "kernel")),
        (("mlp", "wo"), ("mlp", "down_proj", "kernel")),
    )


def decoder_to_tunix_params(decoder: Decoder) -> dict:
    """Our decoder's Params as a pure dict in Tunix Qwen3's layout."""
    c = decoder.config
    ours = nnx.to_pure_dict(nnx.state(decoder, nnx.Param))
    theirs: dict = {}
    set_path(theirs, ("embedder", "input_embedding"), ours["embedding"])
    set_path(theirs, ("final_norm", "w"), ours["final_norm"]["scale"])
    if not c.tie_embeddings:
        set_path(theirs, ("lm_head", "w"), ours["head"])
    for i in range(c.num_layers):
        for our_path, their_path in _layer_pairs():
            value = (get_path(ours["layers"], our_path)[i] if c.scan_layers
                     else get_path(ours["layers"][i], our_path))
            set_path(theirs, ("layers", i, *their_path), value)
    return theirs


def tunix_to_decoder_params(tunix_params: dict, config: DecoderConfig) -> dict:
    """Tunix Qwen3 Params (pure dict) in our decoder's layout for `config`."""
    ours: dict = {"embedding": tunix_params["embedder"]["input_embedding"],
                  "final_norm": {"scale": tunix_params["final_norm"]["w"]}}
    if not config.tie_embeddings:
        ours["head"] = tunix_params["lm_head"]["w"]
    layers = [tunix_params["layers"][i] for i in range(config.num_layers)]
    for our_path, their_path in _layer_pairs():
        values = [get_path(layer, their_path) for layer in layers]
        if config.scan_layers:
            set_path(ours, ("layers", *our_path), array_module(values[0]).stack(values))
        else:
            for i, value in enumerate(values):
                set_path(ours, ("layers", i, *our_path), value)
    return ours


def _load(model: nnx.Module, pure: dict) -> None:
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, pure)
    nnx.update(model, state)


def to_tunix(decoder: Decoder, *, mesh: Mesh | None = None) -> TunixDecoder:
    """A TunixDecoder holding exactly `decoder`'s weights (placed on `mesh` if given)."""
    model = compiled_module(lambda: TunixDecoder(decoder.config, rngs=nnx.Rngs(0)))
    _load(model.qwen3, decoder_to_tunix_params(decoder))
    if mesh is not None:
        place(model, mesh)
    return model


def abstract_tunix(config: DecoderConfig, mesh: Mesh) -> TunixDecoder:
    """Tunix's Qwen3 for `config` as shapes laid out on `mesh` per its own sharding metadata
    (as `place` lays out real weights); nothing is allocated."""
    check_fits(config, mesh)
    graph, state = nnx.split(nnx.eval_shape(lambda: TunixDecoder(config, rngs=nnx.Rngs(0))))
    return nnx.merge(graph, abstract_on(state, nnx.get_named_sharding(state, mesh)))


def from_tunix(model: TunixDecoder, config: DecoderConfig) -> Decoder:
    """Our Decoder (layout per `config`, e.g. scanned) holding `model`'s weights."""
    decoder = build_decoder(config)
    _load(decoder, tunix_to_decoder_params(
        nnx.to_pure_dict(nnx.state(model.qwen3, nnx.Param)), config))
    return decoder


def place(model: TunixDecoder, mesh: Mesh) -> None:
    """Lays Tunix's variables on `mesh` per their own (mesh-axis) sharding metadata."""
    check_fits(model.config, mesh)
    state = nnx.state(model)
    nnx.update(model, jax.device_put(state, nnx.get_named_sharding(state, mesh)))
