"""A Qwen3-architecture decoder written in MaxText's conventions, in Flax NNX.

Every parameter carries MaxText logical axis names (`out_sharding` metadata) and every
activation is constrained with MaxText's activation names; both resolve to mesh axes through
the logical-axis rules active while tracing (see `engine.model.sharding`).

Tensor names carry their shape: B batch, L query length, S key length, D embed, N query
heads, K kv heads, G query heads per kv head, H head dim, F mlp, V vocab.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from engine.model import precast
from engine.model.attention import attention, check_blocks, resolve, trace_platform
from engine.model.config import DecoderConfig
from engine.model.head import check_chunk, chunked_logprobs, head_logits, logit_stats
from engine.model.layer_scan import LayerStack, scan_unfilled
from engine.model.sharding import (
    LOGICAL_AXIS_RULES,
    LogicalRules,
    abstract_on,
    check_fits,
    constrain,
    logical_names,
    named_shardings,
)

BATCH_LEN_EMBED = ("activation_batch", "activation_length", "activation_embed")
NORM_LEN_EMBED = ("activation_batch", "activation_norm_length", "activation_embed")


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], names: tuple[str, ...], *, stddev: float,
           dtype, stack: int | None, read_as: jnp.dtype | None = None) -> nnx.Param:
    """A normally initialized parameter; `stack` prepends a `layers` axis for scanned blocks.
    `read_as`: the dtype the model reads it in, exactly once per call (a matmul operand), which
    lets a trainer cast it once per step (`engine.model.precast`)."""
    if stack is not None:
        shape, names = (stack, *shape), ("layers", *names)
    value = stddev * jax.random.normal(rngs.params(), shape, jnp.float32)
    read = {} if read_as is None else {precast.COMPUTE_DTYPE: jnp.dtype(read_as).name}
    # Created unplaced; `build_decoder`/`shard_model` lay the variables on the mesh.
    return nnx.Param(value.astype(dtype), out_sharding=names, eager_sharding=False, **read)


def _ones(shape: tuple[int, ...], names: tuple[str, ...], *, dtype,
          stack: int | None) -> nnx.Param:
    if stack is not None:
        shape, names = (stack, *shape), ("layers", *names)
    return nnx.Param(jnp.ones(shape, dtype), out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
    """x / rms(x) * scale, computed in float32."""

    def __init__(self, dim: int, config: DecoderConfig, *, stack: int | None = None):
        self.scale = _ones((dim,), ("norm",), dtype=config.storage_dtype, stack=stack)
        self.eps = config.norm_eps
        self.dtype = config.compute_dtype

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        rms = jnp.sqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (self.scale[...].astype(jnp.float32) * (x32 / rms)).astype(self.dtype)


def apply_rope(x_BxLxNxH: jax.Array, positions_BxL: jax.Array, theta: float) -> jax.Array:
    """Rotate-half rotary embedding (the first and second halves of H form the pairs)."""
    head_dim = x_BxLxNxH.shape[-1]
    fraction = 2 * jnp.arange(0, head_dim // 2, dtype=jnp.float32) / head_dim
    timescale_H2 = theta**fraction
    angle_BxLx1xH2 = (positions_BxL[..., None].astype(jnp.float32) / timescale_H2)[:, :, None, :]
    sin, cos = jnp.sin(angle_BxLx1xH2), jnp.cos(angle_BxLx1xH2)
    sin, cos = sin.astype(x_BxLxNxH.dtype), cos.astype(x_BxLxNxH.dtype)
    first, second = jnp.split(x_BxLxNxH, 2, axis=-1)
    return jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


class Masking(NamedTuple):
    """What the attention of every layer is given besides its activations."""

    kind: str
    """The implementation resolved for this program: "xla" or a kernel (`resolve`)."""
    segment_ids: jax.Array
    """[B, L] packed-document id per token (the kernels' masking)."""
    mask: jax.Array | None
    """[B, L, S] causal same-segment mask (the XLA path's; None where a kernel runs)."""


def masking(config: DecoderConfig, segment_ids_BxL: jax.Array) -> Masking:
    """The attention implementation `config.attention` resolves to for this length on the
    platform being traced for, and what it reads (the [B, L, S] mask only for XLA)."""
    kind = resolve(config.attention, seq=segment_ids_BxL.shape[1], platform=trace_platform(),
                   block_q=config.attention_block_q, block_kv=config.attention_block_kv)
    mask_BxLxS = attention_mask(segment_ids_BxL) if kind == "xla" else None
    return Masking(kind, segment_ids_BxL, mask_BxLxS)


class Attention(nnx.Module):
    """GQA self-attention with per-head RMSNorm on q and k applied before RoPE."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs, stack: int | None = None):
        c, d_std = config, config.embed_dim**-0.5
        weight = functools.partial(_param, rngs, dtype=c.storage_dtype, stack=stack,
                                   read_as=c.compute_dtype)
        self.query = weight((c.embed_dim, c.num_heads, c.head_dim), ("embed", "q_heads", "kv"),
                            stddev=d_std)
        self.key = weight((c.embed_dim, c.num_kv_heads, c.head_dim), ("embed", "kv_heads", "kv"),
                          stddev=d_std)
        self.value = weight((c.embed_dim, c.num_kv_heads, c.head_dim),
                            ("embed", "kv_heads", "kv"), stddev=d_std)
        self.out = weight((c.num_heads, c.head_dim, c.embed_dim), ("heads", "kv", "embed"),
                          stddev=(c.num_heads * c.head_dim)**-0.5)
        self.query_norm = RMSNorm(c.head_dim, c, stack=stack)
        self.key_norm = RMSNorm(c.head_dim, c, stack=stack)
        self.config = config

    def __call__(self, x_BxLxD: jax.Array, positions_BxL: jax.Array,
                 masks: Masking) -> jax.Array:
        c, dt = self.config, self.config.compute_dtype
        q_BxLxNxH = jnp.einsum("BLD,DNH->BLNH", x_BxLxD, self.query[...].astype(dt))
        k_BxSxKxH = jnp.einsum("BSD,DKH->BSKH", x_BxLxD, self.key[...].astype(dt))
        v_BxSxKxH = jnp.einsum("BSD,DKH->BSKH", x_BxLxD, self.value[...].astype(dt))
        q_BxLxNxH = constrain(self.query_norm(q_BxLxNxH), (
            "activation_batch", "activation_length", "activation_heads", "activation_kv"))
        k_BxSxKxH = constrain(self.key_norm(k_BxSxKxH), (
            "activation_batch", "activation_length", "activation_kv_heads", "activation_kv"))
        v_BxSxKxH = constrain(v_BxSxKxH, (
            "activation_batch", "activation_length", "activation_kv_heads", "activation_kv"))
        q_BxLxNxH = apply_rope(q_BxLxNxH, positions_BxL, c.rope_theta)
        k_BxSxKxH = apply_rope(k_BxSxKxH, positions_BxL, c.rope_theta)

        b, length, n, h = q_BxLxNxH.shape
        q_BxLxKxGxH = q_BxLxNxH.reshape(b, length, c.num_kv_heads, n // c.num_kv_heads, h)
        o_BxLxKxGxH = attention(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH, kind=masks.kind,
                                segment_ids_BxL=masks.segment_ids,
                                mask_BxLxS=masks.mask, block_q=c.attention_block_q,
                                block_kv=c.attention_block_kv)
        o_BxLxNxH = constrain(o_BxLxKxGxH.reshape(b, length, n, h), (
            "activation_batch", "activation_length", "activation_heads", "activation_kv"))
        out_BxLxD = jnp.einsum("BLNH,NHD->BLD", o_BxLxNxH, self.out[...].astype(dt))
        return constrain(out_BxLxD, BATCH_LEN_EMBED)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs, stack: int | None = None):
        c = config
        weight = functools.partial(_param, rngs, dtype=c.storage_dtype, stack=stack,
                                   read_as=c.compute_dtype)
        self.wi_0 = weight((c.embed_dim, c.mlp_dim), ("embed", "mlp"), stddev=c.embed_dim**-0.5)
        self.wi_1 = weight((c.embed_dim, c.mlp_dim), ("embed", "mlp"), stddev=c.embed_dim**-0.5)
        self.wo = weight((c.mlp_dim, c.embed_dim), ("mlp", "embed"), stddev=c.mlp_dim**-0.5)
        self.dtype = c.compute_dtype

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        dt = self.dtype
        gate_BxLxF = jnp.einsum("BLD,DF->BLF", x_BxLxD, self.wi_0[...].astype(dt))
        up_BxLxF = jnp.einsum("BLD,DF->BLF", x_BxLxD, self.wi_1[...].astype(dt))
        hidden_BxLxF = constrain(jax.nn.silu(gate_BxLxF) * up_BxLxF, (
            "activation_batch", "activation_length", "activation_mlp"))
        out_BxLxD = jnp.einsum("BLF,FD->BLD", hidden_BxLxF, self.wo[...].astype(dt))
        return constrain(out_BxLxD, BATCH_LEN_EMBED)


class DecoderBlock(nnx.Module):
    """Pre-norm attention and MLP, each with a residual connection."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs, stack: int | None = None):
        self.pre_attention_norm = RMSNorm(config.embed_dim, config, stack=stack)
        self.attention = Attention(config, rngs=rngs, stack=stack)
        self.pre_mlp_norm = RMSNorm(config.embed_dim, config, stack=stack)
        self.mlp = MLP(config, rngs=rngs, stack=stack)

    def __call__(self, x_BxLxD: jax.Array, positions_BxL: jax.Array,
                 masks: Masking) -> jax.Array:
        normed_BxLxD = constrain(self.pre_attention_norm(x_BxLxD), NORM_LEN_EMBED)
        x_BxLxD = x_BxLxD + self.attention(normed_BxLxD, positions_BxL, masks)
        normed_BxLxD = constrain(self.pre_mlp_norm(x_BxLxD), NORM_LEN_EMBED)
        return constrain(x_BxLxD + self.mlp(normed_BxLxD), BATCH_LEN_EMBED)


def _remat(fn, policy: str):
    if policy == "none":
        return fn
    saveable = (jax.checkpoint_policies.nothing_saveable if policy == "full"
                else jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return jax.checkpoint(fn, policy=saveable)


def _scan_unfilled(layers: nnx.Module, x_BxLxD: jax.Array, positions_BxL: jax.Array,
                   masks: Masking) -> jax.Array:
    """The stacked blocks run by engine.model.layer_scan (DecoderConfig.scan_backward)."""
    graph, stacked = nnx.split(layers)
    leaves, treedef = jax.tree.flatten(stacked)
    axes = tuple(tuple(spec) for spec in jax.tree.leaves(
        logical_names(stacked), is_leaf=lambda s: isinstance(s, PartitionSpec)))

    def block(layer, x_BxLxD, consts):
        positions_BxL, segment_ids_BxL, mask_BxLxS = consts
        model = nnx.merge(graph, jax.tree.unflatten(treedef, layer))
        return model(x_BxLxD, positions_BxL, Masking(masks.kind, segment_ids_BxL, mask_BxLxS))

    return scan_unfilled(LayerStack(block, axes), x_BxLxD, leaves,
                         (positions_BxL, masks.segment_ids, masks.mask))


def attention_mask(segment_ids_BxL: jax.Array) -> jax.Array:
    """Causal mask restricted to tokens of the same packed segment: [B, L, S] booleans."""
    length = segment_ids_BxL.shape[1]
    causal_LxS = jnp.tril(jnp.ones((length, length), dtype=jnp.bool_))
    same_segment_BxLxS = segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :]
    return causal_LxS[None] & same_segment_BxLxS


class Decoder(nnx.Module):
    """Token embedding -> blocks -> final RMSNorm -> (tied or untied) head; float32 logits."""

    def __init__(self, config: DecoderConfig, *, rngs: nnx.Rngs):
        c = config
        self.config = c
        self.embedding = _param(rngs, (c.vocab_size, c.embed_dim), ("vocab", "embed_vocab"),
                                stddev=0.02, dtype=c.storage_dtype, stack=None)
        if c.scan_layers:
            self.layers = DecoderBlock(c, rngs=rngs, stack=c.num_layers)
        else:
            self.layers = nnx.List([DecoderBlock(c, rngs=rngs) for _ in range(c.num_layers)])
        self.final_norm = RMSNorm(c.embed_dim, c)
        if not c.tie_embeddings:
            self.head = _param(rngs, (c.embed_dim, c.vocab_size), ("embed", "vocab"),
                               stddev=c.embed_dim**-0.5, dtype=c.storage_dtype, stack=None)

    def hidden(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
               segment_ids_BxL: jax.Array) -> jax.Array:
        """The final normed hidden states [B, L, D] (what the head multiplies)."""
        c, dt = self.config, self.config.compute_dtype
        masks = masking(c, segment_ids_BxL)
        x_BxLxD = constrain(self.embedding[...][tokens_BxL].astype(dt), BATCH_LEN_EMBED)

        def run_block(block_graph, block_state, x_BxLxD):
            block = nnx.merge(block_graph, block_state)
            return block(x_BxLxD, positions_BxL, masks)

        if c.scan_layers and c.scan_backward == "unfilled":
            x_BxLxD = _scan_unfilled(self.layers, x_BxLxD, positions_BxL, masks)
        elif c.scan_layers:
            graph, stacked = nnx.split(self.layers)
            step = _remat(lambda x, layer: (run_block(graph, layer, x), None), c.remat)
            x_BxLxD, _ = jax.lax.scan(step, x_BxLxD, stacked)
        else:
            for block in self.layers:
                graph, state = nnx.split(block)
                x_BxLxD = _remat(lambda s, x, g=graph: run_block(g, s, x), c.remat)(state, x_BxLxD)
        return constrain(self.final_norm(x_BxLxD), NORM_LEN_EMBED)

    def head_matrix(self) -> jax.Array:
        """The output head [D, V] in its stored dtype: the transposed embedding where tied."""
        return self.embedding[...].T if self.config.tie_embeddings else self.head[...]

    def __call__(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
                 segment_ids_BxL: jax.Array) -> jax.Array:
        """float32 logits [B, L, V], whole (whatever `logits_chunk` says)."""
        x_BxLxD = self.hidden(tokens_BxL, positions_BxL, segment_ids_BxL)
        return head_logits(x_BxLxD, self.head_matrix(), self.config.compute_dtype)

    def token_logprobs(self, tokens_BxL: jax.Array, positions_BxL: jax.Array,
                       segment_ids_BxL: jax.Array,
                       targets_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
        """(log p(target), logsumexp of the logits) per position, float32: from the whole
        logits, or `config.logits_chunk` positions at a time (engine.model.head), the head
        read as stored (a tied embedding [V, D], an untied head [D, V])."""
        c = self.config
        x_BxLxD = self.hidden(tokens_BxL, positions_BxL, segment_ids_BxL)
        if not c.logits_chunk:
            return logit_stats(head_logits(x_BxLxD, self.head_matrix(), c.compute_dtype),
                               targets_BxL)
        head, layout = ((self.embedding[...], "VD") if c.tie_embeddings
                        else (self.head[...], "DV"))
        return chunked_logprobs(x_BxLxD, head, targets_BxL, chunk=c.logits_chunk,
                                dtype=c.compute_dtype, layout=layout)


def check_sequence(config: DecoderConfig, seq: int) -> None:
    """Raises one ValueError where `config`'s kernel blocks or logits chunk cannot tile
    sequences of length `seq` (before anything is built)."""
    check_blocks(config.attention, seq, config.attention_block_q, config.attention_block_kv)
    check_chunk(config.logits_chunk, seq)


def build_decoder(config: DecoderConfig, *, seed: int = 0, mesh: Mesh | None = None,
                  rules: LogicalRules = LOGICAL_AXIS_RULES) -> Decoder:
    """A freshly initialized decoder, its variables already laid out on `mesh` if given.

    Initialization is one compiled program (see `initializer`); with a mesh the parameters'
    shardings are its `out_shardings`, so each device materializes only its own shards (no
    full copy on one device first).
    """
    if mesh is not None:
        check_fits(config, mesh)
    graph, init = initializer(config, seed, mesh, rules)
    return nnx.merge(graph, init())


def abstract_decoder(config: DecoderConfig, mesh: Mesh,
                     rules: LogicalRules = LOGICAL_AXIS_RULES) -> Decoder:
    """A decoder of `config` whose variables are shapes laid out on `mesh` (no weights): what
    a program needs to be traced and compiled for a mesh, including one of devices this host
    does not have (a TPU topology's compile-only devices)."""
    check_fits(config, mesh)
    graph, state = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0))))
    return nnx.merge(graph, abstract_on(state, named_shardings(state, mesh, rules)))


@functools.lru_cache(maxsize=4)
def initializer(config: DecoderConfig, seed: int, mesh: Mesh | None,
                 rules: LogicalRules) -> tuple[nnx.GraphDef, jax.stages.Compiled]:
    """(graph, compiled init) of one decoder, kept so a second model with the same weights
    and layout (e.g. the parity reference beside an arm) costs no second compile.

    Eagerly, every parameter's random draw would be its own dispatch and compile. It is
    compiled with run_once_options (on CPU, no LLVM optimization: it runs once, and its
    threefry draws otherwise cost more to optimize than to run). Its values can differ
    from an optimized build's in the last float32 bit; every model here (each arm's and the
    parity reference's) is initialized by this function, so they all start from the same
    bits.
    """
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(seed)))
    graph, abstract_state = nnx.split(abstract)
    shardings = None if mesh is None else named_shardings(abstract_state, mesh, rules)

    def init():
        return nnx.split(Decoder(config, rngs=nnx.Rngs(seed)))[1]

    platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
    lowered = jax.jit(init, out_shardings=shardings).lower()
    return graph, lowered.compile(compiler_options=run_once_options(platform))


def run_once_options(platform: str | None = None) -> dict:
    """Compiler options for a program that runs once or twice (an initializer, the exact
    parity reference, a selftest forward) on `platform` (default: JAX's default backend).
    On CPU, no LLVM optimization: for one run it costs more than it saves, and the HLO (what
    is computed, in what order) is still the optimized one; only the machine code differs.
    Elsewhere none."""
    platform = platform or jax.default_backend()
    return {"xla_backend_optimization_level": 0} if platform == "cpu" else {}


def param_count(config: DecoderConfig) -> int:
    """Number of parameters of `config`, from abstract shapes (nothing is allocated)."""
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
