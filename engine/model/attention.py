"""Causal grouped-query attention over packed rows: the XLA einsum path and JAX's own Pallas
TPU kernels (`jax.experimental.pallas.ops.tpu`: splash, and flash for the microbenchmark),
and the rule that picks one (`resolve`).

Every implementation computes the same function: softmax(q.k / sqrt(H)) . v, each query
attending to the keys at or before it inside its own packed segment (equal segment ids). The
kernels never build the [B, L, S] mask: the causal part is the kernel's static mask (whole
blocks above the diagonal are skipped) and the packing is its segment ids.

On a TPU the kernels are compiled by Mosaic. On any other platform they run in Pallas
interpret mode (the kernel body evaluated as ordinary XLA ops, block by block): the same
arithmetic, orders of magnitude slower, meant for tests and small CPU runs.

Tensor names carry their shape: B batch, L query length, S key length, K kv heads, G query
heads per kv head, N = K x G query heads, H head dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax.linen import partitioning as nn_partitioning

MASK_VALUE = -2.3819763e38
"""Additive value of a disallowed score in the XLA path (finite, so no row is ever NaN)."""

KERNELS = ("splash",)
"""Pallas kernels the decoder can run (DecoderConfig.attention)."""

AUTO_KERNEL = "splash"
"""The kernel `attention="auto"` picks where a kernel wins."""

AUTO_KERNEL_MIN_SEQ = 2048
"""`attention="auto"` runs AUTO_KERNEL on a TPU from this sequence length up: the shortest
length where the kernel was measured to win. The chip's measurements of one qwen3-0.6b layer
(16 query heads, 8 kv heads, head dim 128, bf16, causal, forward + backward; `parity kernels`
on one TPU v5e, docs/results/tpu-v5e/h2h73/kernels*.md), splash with 512-row q blocks and
1024-column kv blocks against the XLA path, median of 20: seq 4096 3.55-3.77 against
7.35-7.44 ms; seq 2048 1.73 against 2.54 ms at one row and 2.70 against 4.30 at two (each
kernel run faster than every XLA run); seq 1024 at two rows 1.42-1.49 against 1.39-1.50, the
runs of both overlapping: no win measured there. Lengths between 1024 and 2048 were not
measured."""

AUTO_PLATFORMS = ("tpu",)
"""Platforms where `attention="auto"` may pick a kernel (elsewhere it runs in interpret mode)."""


def attend(q_BxLxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
           mask_BxLxS: jax.Array) -> jax.Array:
    """softmax(q.k / sqrt(H), masked) . v for grouped queries, in q's dtype (the XLA path).

    The softmax is normalized after the value product: exp(scores - max) feeds the product
    directly (XLA computes the exponentials inside the matmul's fusion) and the [B, L, K, G,
    H] output is divided by their sum. Normalizing first would write the [B, K, G, L, S]
    probabilities to memory and read them back, in the forward and again in the backward; on
    the TPU plan of qwen3-1.7b at 4096 tokens that was 15% of a step's HBM traffic. Scores,
    exponentials and sums are float32; the product takes the exponentials in q's dtype and
    accumulates in float32. The max is a constant shift (it cancels in the ratio), so no
    gradient flows through it.
    """
    dt, h = q_BxLxKxGxH.dtype, q_BxLxKxGxH.shape[-1]
    scores_BxKxGxLxS = jnp.einsum("BLKGH,BSKH->BKGLS", q_BxLxKxGxH, k_BxSxKxH) * h**-0.5
    scores_BxKxGxLxS = jnp.where(mask_BxLxS[:, None, None], scores_BxKxGxLxS, MASK_VALUE)
    scores_BxKxGxLxS = scores_BxKxGxLxS.astype(jnp.float32)
    max_BxKxGxLx1 = jax.lax.stop_gradient(jnp.max(scores_BxKxGxLxS, axis=-1, keepdims=True))
    exps_BxKxGxLxS = jnp.exp(scores_BxKxGxLxS - max_BxKxGxLx1)
    sum_BxLxKxG = jnp.einsum("BKGLS->BLKG", exps_BxKxGxLxS)
    o_BxLxKxGxH = jnp.einsum("BKGLS,BSKH->BLKGH", exps_BxKxGxLxS.astype(dt), v_BxSxKxH,
                             preferred_element_type=jnp.float32)
    return (o_BxLxKxGxH / sum_BxLxKxG[..., None]).astype(dt)


def resolve(kind: str, *, seq: int, platform: str, block_q: int, block_kv: int) -> str:
    """The implementation `kind` (DecoderConfig.attention) runs at length `seq` on
    `platform`: "xla" or a kernel. "auto" is AUTO_KERNEL on AUTO_PLATFORMS from
    AUTO_KERNEL_MIN_SEQ up where both block sizes divide `seq`, "xla" everywhere else (on CPU
    always); any other kind is itself."""
    if kind != "auto":
        return kind
    wins = (platform in AUTO_PLATFORMS and seq >= AUTO_KERNEL_MIN_SEQ
            and not seq % block_q and not seq % block_kv)
    return AUTO_KERNEL if wins else "xla"


def check_blocks(kind: str, seq: int, block_q: int, block_kv: int) -> None:
    """Raises one ValueError where an explicitly asked kernel cannot tile `seq` (its blocks
    must divide it); "xla" and "auto" (which falls back to xla) take any length."""
    if kind in KERNELS:
        check_tiles(kind, seq, block_q, block_kv)


LANES = 128
"""The TPU's vector lane width: the kernels' blocks (with segment ids, both kinds) are whole
multiples of it."""


def check_tiles(kernel: str, seq: int, block_q: int, block_kv: int) -> None:
    """Raises one ValueError naming the fix where `block_q` or `block_kv` is not a multiple
    of LANES or does not divide `seq`: the kernels tile the whole sequence in blocks."""
    for name, block in (("attention_block_q", block_q), ("attention_block_kv", block_kv)):
        flag = "--" + name.replace("_", "-")
        if block % LANES:
            raise ValueError(f"{name}={block}: the {kernel} attention kernel's blocks are "
                             f"multiples of {LANES} (the TPU's lane width); pass {flag} "
                             f"{max(LANES, block // LANES * LANES)}")
        if seq % block:
            raise ValueError(
                f"the {kernel} attention kernel tiles the sequence in blocks: {name}={block} "
                f"does not divide seq {seq}; pass {flag} with a multiple of {LANES} that "
                f"divides {seq} (e.g. {_largest_tile(seq, block)}), or --attention xla")


def _largest_tile(seq: int, at_most: int) -> int | str:
    """The largest multiple of LANES up to `at_most` dividing `seq` (a hint for the fix)."""
    found = [b for b in range(LANES, at_most + 1, LANES) if not seq % b]
    return found[-1] if found else f"none: seq {seq} is not a multiple of {LANES}"


def trace_platform() -> str:
    """The platform the program being traced is for: that of the mesh in scope (`jax.set_mesh`;
    a TPU topology's compile-only devices in a CPU process are "tpu"), else JAX's default."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()


def attention(q_BxLxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array, *,
              kind: str, segment_ids_BxL: jax.Array, mask_BxLxS: jax.Array | None,
              block_q: int, block_kv: int) -> jax.Array:
    """Attention by the implementation `kind` has resolved to ("xla" reads `mask_BxLxS`, a
    kernel the segment ids)."""
    if kind == "xla":
        return attend(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH, mask_BxLxS)
    if kind != "splash":
        raise ValueError(f"attention kind {kind!r} is not one the decoder runs: "
                         f"xla, {', '.join(KERNELS)}")
    return splash(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH, segment_ids_BxL, block_q=block_q,
                  block_kv=block_kv, interpret=trace_platform() != "tpu")


def to_heads_major(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH):
    """The kernels' layout: q [B, N, L, H] (query head n = kv head x G + g), k and v
    [B, K, S, H]; q is scaled by 1/sqrt(H) here (the kernels take it pre-scaled)."""
    b, length, kv, groups, h = q_BxLxKxGxH.shape
    q_BxNxLxH = (q_BxLxKxGxH * jnp.asarray(h**-0.5, q_BxLxKxGxH.dtype)).reshape(
        b, length, kv * groups, h).transpose(0, 2, 1, 3)
    return q_BxNxLxH, k_BxSxKxH.transpose(0, 2, 1, 3), v_BxSxKxH.transpose(0, 2, 1, 3)


def from_heads_major(o_BxNxLxH: jax.Array, kv_heads: int) -> jax.Array:
    """[B, N, L, H] -> [B, L, K, G, H]."""
    b, n, length, h = o_BxNxLxH.shape
    return o_BxNxLxH.transpose(0, 2, 1, 3).reshape(b, length, kv_heads, n // kv_heads, h)


def splash(q_BxLxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
           segment_ids_BxL: jax.Array, *, block_q: int, block_kv: int,
           interpret: bool) -> jax.Array:
    """Causal grouped-query attention by JAX's Pallas splash kernel, `block_q` query rows by
    `block_kv` keys per block in the forward and in both backward kernels (dq, dkv); the
    output in q's dtype. Under a mesh, one kernel per device on its rows and heads
    (`on_mesh`)."""
    check_tiles("splash", q_BxLxKxGxH.shape[1], block_q, block_kv)
    q_BxNxLxH, k_BxKxSxH, v_BxKxSxH = to_heads_major(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH)
    run = functools.partial(_splash_local, block_q=block_q, block_kv=block_kv,
                            interpret=interpret)
    o_BxNxLxH = on_mesh(run, q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL)
    return from_heads_major(o_BxNxLxH, k_BxSxKxH.shape[2])


def _splash_local(q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL, *, block_q, block_kv,
                  interpret):
    """The splash kernel over the rows and heads this device holds (vmapped over rows)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    _, n, length, _ = q_BxNxLxH.shape
    blocks = sa.BlockSizes(block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv,
                           block_q_dkv=block_q, block_kv_dkv=block_kv,
                           block_kv_dkv_compute=block_kv, block_q_dq=block_q,
                           block_kv_dq=block_kv)
    mask = sa.MultiHeadMask([sa.CausalMask((length, length)) for _ in range(n)])
    kernel = sa.make_splash_mha(mask, block_sizes=blocks, head_shards=1, q_seq_shards=1,
                                interpret=interpret)

    def one_row(q_NxLxH, k_KxSxH, v_KxSxH, segment_ids_L):
        return kernel(q_NxLxH, k_KxSxH, v_KxSxH,
                      segment_ids=sa.SegmentIds(q=segment_ids_L, kv=segment_ids_L))

    return jax.vmap(one_row)(q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL)


def flash(q_BxLxKxGxH: jax.Array, k_BxSxKxH: jax.Array, v_BxSxKxH: jax.Array,
          segment_ids_BxL: jax.Array, *, block_q: int, block_kv: int) -> jax.Array:
    """Causal attention by JAX's Pallas flash kernel (a variant the microbenchmark times;
    the decoder runs splash): `block_q` query rows by `block_kv` keys per block, forward and
    backward. Flash has no grouped-query form, so each kv head is repeated for its G query
    heads. It has no interpret switch of its own: off a TPU, trace the whole computation
    (its gradient included) under `jax.experimental.pallas.tpu.force_tpu_interpret_mode()`."""
    from jax.experimental.pallas.ops.tpu import flash_attention as fa

    check_tiles("flash", q_BxLxKxGxH.shape[1], block_q, block_kv)
    groups = q_BxLxKxGxH.shape[3]
    q_BxNxLxH, k_BxKxSxH, v_BxKxSxH = to_heads_major(q_BxLxKxGxH, k_BxSxKxH, v_BxSxKxH)
    blocks = fa.BlockSizes(block_q=block_q, block_k_major=block_kv, block_k=block_kv,
                           block_b=1, block_q_major_dkv=block_q, block_k_major_dkv=block_kv,
                           block_k_dkv=block_kv, block_q_dkv=block_q,
                           block_k_major_dq=block_kv, block_k_dq=block_kv, block_q_dq=block_q)

    def run(q, k, v, segment_ids):
        k, v = jnp.repeat(k, groups, axis=1), jnp.repeat(v, groups, axis=1)
        return fa.flash_attention(q, k, v, segment_ids=fa.SegmentIds(q=segment_ids,
                                                                     kv=segment_ids),
                                  causal=True, sm_scale=1.0, block_sizes=blocks)

    o_BxNxLxH = on_mesh(run, q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL)
    return from_heads_major(o_BxNxLxH, k_BxSxKxH.shape[2])


def on_mesh(kernel, q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL):
    """`kernel(q, k, v, segment_ids)` on each device's own rows and heads of the mesh in
    scope, as the logical-axis rules lay out the decoder's activations (rows over the batch
    axes, heads over `activation_heads`'s); called directly without a mesh or on one device.
    A Pallas kernel is one opaque call XLA cannot split, hence the shard_map. Query and kv
    heads must be split alike, so that each device holds whole query groups of its kv
    heads."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return kernel(q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL)
    q_spec = nn_partitioning.logical_to_mesh_axes(
        ("activation_batch", "activation_heads", None, None))
    kv_spec = nn_partitioning.logical_to_mesh_axes(
        ("activation_batch", "activation_kv_heads", None, None))
    if q_spec[1] != kv_spec[1]:
        raise ValueError(f"the attention kernel needs query and kv heads split over the same "
                         f"mesh axes; the rules give {q_spec[1]!r} and {kv_spec[1]!r}")
    rows_spec = jax.sharding.PartitionSpec(q_spec[0], None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, rows_spec),
                         out_specs=q_spec, check_vma=False)(
        q_BxNxLxH, k_BxKxSxH, v_BxKxSxH, segment_ids_BxL)
