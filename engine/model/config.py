"""Typed configuration and named presets for the MaxText-style Qwen3 decoder."""

from __future__ import annotations

import dataclasses
import typing
from typing import Literal

import jax.numpy as jnp

RematPolicy = Literal["none", "minimal", "full"]
REMAT_POLICIES: tuple[str, ...] = typing.get_args(RematPolicy)
ScanBackward = Literal["jax", "unfilled"]
SCAN_BACKWARDS: tuple[str, ...] = typing.get_args(ScanBackward)
"""Rematerialization per block: nothing, save matmul outputs, or recompute everything."""

AttentionKind = Literal["xla", "splash", "auto"]
ATTENTION_KINDS: tuple[str, ...] = typing.get_args(AttentionKind)
"""Attention implementations (engine.model.attention): XLA's einsums, the Pallas splash kernel,
or the rule that picks between them."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DecoderConfig:
    """Shape and numerics of a Qwen3-architecture decoder."""

    vocab_size: int
    """Number of token ids; rows of the embedding table (and columns of the head)."""
    embed_dim: int
    """Width of the residual stream (d_model)."""
    num_layers: int
    """Number of decoder blocks."""
    num_heads: int
    """Query heads per attention layer."""
    num_kv_heads: int
    """Key/value heads (GQA); must divide `num_heads`."""
    head_dim: int
    """Width of one attention head (q, k and v)."""
    mlp_dim: int
    """Hidden width of the SwiGLU MLP."""
    rope_theta: float = 1_000_000.0
    """RoPE base; timescales are theta ** (2i / head_dim)."""
    norm_eps: float = 1e-6
    """Epsilon inside the RMSNorm square root."""
    tie_embeddings: bool = True
    """If True the output head is the transposed token embedding; else a separate matrix."""
    dtype: str = "float32"
    """Activation/compute dtype ("float32" or "bfloat16"); logits are always float32."""
    param_dtype: str = "float32"
    """Storage dtype of the parameters."""
    scan_layers: bool = False
    """Stack the blocks' parameters on a leading `layers` axis and run them with lax.scan."""
    remat: RematPolicy = "none"
    """Rematerialization per block: "none", "minimal" (save matmul outputs) or "full"."""
    scan_backward: ScanBackward = "jax"
    """How the scanned blocks are differentiated: "jax" (the transpose of `jax.lax.scan`,
    whose stacked weight gradient starts as zeros the layers then overwrite) or "unfilled"
    (engine.model.layer_scan: the gradient written one layer at a time into a buffer never
    filled; with scan_layers and remat="full", whose recompute it performs itself). A
    candidate for the chip to time (issue 74), the same gradient either way."""
    attention: AttentionKind = "xla"
    """Attention implementation: "xla" (einsums over the [B, L, S] mask), "splash" (JAX's
    Pallas splash kernel: compiled on a TPU, in Pallas interpret mode elsewhere, which is
    slow and meant for tests), or "auto": splash on a TPU from
    engine.model.attention.AUTO_KERNEL_MIN_SEQ (2048) positions up where the block sizes
    divide the length, xla everywhere else. "xla" stays the default until the chip's A/B
    decides (docs/tpu-v5e.md)."""
    attention_block_q: int = 512
    """Query rows per block of the attention kernel (forward and backward). The default is
    the chip's best measured at seq 4096 (issue 69); the kernel's own default, 128, was twice
    as slow as XLA there."""
    attention_block_kv: int = 1024
    """Keys per block of the attention kernel (forward and backward; the chip's best at seq
    4096 with 512-row query blocks)."""
    logits_chunk: int = 0
    """Positions per chunk of the output head and the loss's per-token statistics: the float32
    logits exist one [B, logits_chunk, V] slice at a time, forward and backward
    (engine.model.head); 0 computes the whole [B, L, V] at once. Read by the workload losses
    through `Decoder.token_logprobs`; the decoder's call always returns whole logits."""

    def __post_init__(self):
        positive = ("vocab_size", "embed_dim", "num_layers", "num_heads", "num_kv_heads",
                    "head_dim", "mlp_dim")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(
                    f"DecoderConfig.{name} must be positive, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.num_kv_heads}; "
                "GQA needs each kv head to serve a whole group of query heads: pick num_kv_heads "
                f"from the divisors of {self.num_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotate-half RoPE")
        if self.remat not in REMAT_POLICIES:
            raise ValueError(f"remat={self.remat!r}; valid: "
                             f"{', '.join(repr(p) for p in REMAT_POLICIES)}")
        if self.scan_backward not in SCAN_BACKWARDS:
            raise ValueError(f"scan_backward={self.scan_backward!r}; valid: "
                             f"{', '.join(repr(k) for k in SCAN_BACKWARDS)}")
        if self.scan_backward == "unfilled" and not (self.scan_layers and self.remat == "full"):
            raise ValueError("scan_backward='unfilled' differentiates scanned blocks by "
                             "recomputing each one: give scan_layers=True and remat='full' "
                             f"(got scan_layers={self.scan_layers}, remat={self.remat!r})")
        if self.attention not in ATTENTION_KINDS:
            raise ValueError(f"attention={self.attention!r}; valid: "
                             f"{', '.join(repr(k) for k in ATTENTION_KINDS)}")
        for name in ("attention_block_q", "attention_block_kv"):
            if getattr(self, name) <= 0:
                raise ValueError(f"DecoderConfig.{name} must be positive, got "
                                 f"{getattr(self, name)}")
        if self.logits_chunk < 0:
            raise ValueError(f"logits_chunk={self.logits_chunk}: give the positions per chunk "
                             "(> 0), or 0 for the whole logits at once")
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in ("float32", "bfloat16"):
                raise ValueError(f"{name}={getattr(self, name)!r}; valid: 'float32', 'bfloat16'")

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def storage_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> DecoderConfig:
        return dataclasses.replace(self, **changes)

    def plain(self) -> DecoderConfig:
        """The same function computed the plain way: XLA attention, the whole logits at once
        and JAX's own scan transpose (what an exact reference runs, whatever kernel, chunking
        or backward an arm uses)."""
        return self.replace(attention="xla", logits_chunk=0, scan_backward="jax")


_QWEN3_COMMON = dict(vocab_size=151_936, head_dim=128, num_kv_heads=8,
                     rope_theta=1_000_000.0, norm_eps=1e-6)

PRESETS: dict[str, DecoderConfig] = {
    # Unit tests: < 1M parameters; every width divides 8 so fsdp=8 and tensor=2 both shard it.
    "tiny": DecoderConfig(vocab_size=256, embed_dim=64, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=16, mlp_dim=128),
    # `tiny` with a separate output head: parity against models whose tied head differs
    # (maxtext 0.2.5 reads its tied head in bfloat16).
    "tiny-untied": DecoderConfig(vocab_size=256, embed_dim=64, num_layers=2, num_heads=4,
                                 num_kv_heads=2, head_dim=16, mlp_dim=128,
                                 tie_embeddings=False),
    # CPU benchmarks: a step of a few hundred ms on two cores at batch 8 x seq 128.
    "small": DecoderConfig(vocab_size=4096, embed_dim=256, num_layers=4, num_heads=8,
                           num_kv_heads=4, head_dim=32, mlp_dim=768),
    # `small` with a separate output head: the exact CPU comparison with the MaxText arms.
    "small-untied": DecoderConfig(vocab_size=4096, embed_dim=256, num_layers=4, num_heads=8,
                                  num_kv_heads=4, head_dim=32, mlp_dim=768,
                                  tie_embeddings=False),
    # Real Qwen3 dimensions (Hugging Face configs; identical to Tunix's presets).
    "qwen3-0.6b": DecoderConfig(embed_dim=1024, num_layers=28, num_heads=16, mlp_dim=3072,
                                tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-1.7b": DecoderConfig(embed_dim=2048, num_layers=28, num_heads=16, mlp_dim=6144,
                                tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-4b": DecoderConfig(embed_dim=2560, num_layers=36, num_heads=32, mlp_dim=9728,
                              tie_embeddings=True, **_QWEN3_COMMON),
    "qwen3-8b": DecoderConfig(embed_dim=4096, num_layers=36, num_heads=32, mlp_dim=12288,
                              tie_embeddings=False, **_QWEN3_COMMON),
}


def get_preset(name: str, **overrides) -> DecoderConfig:
    """Returns the named preset, with `overrides` applied (e.g. scan_layers=True)."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides)
