"""The kernel microbenchmark (`parity kernels`): one decoder layer's attention by each variant
(XLA, Pallas splash and flash at given block sizes) and the output head with the loss's
per-token statistics (whole logits or chunks of positions), forward + backward, each timed as
the median of N runs on this process's first device, beside what each costs that does not
vary (XLA's planned temporary bytes) and how far its values are from the plain variant's.

On a TPU the kernels are compiled by Mosaic; on any other platform they run in Pallas
interpret mode, where their times mean nothing and only the behaviour and the numerics are
checked. Shapes are the preset's: query heads, kv heads and head dim for attention; width and
vocabulary (and whether the head is the tied embedding) for the loss.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from engine.model import DecoderConfig
from engine.model.attention import attend, check_tiles, flash, splash
from engine.model.decoder import attention_mask
from engine.model.head import check_chunk, chunked_logprobs, head_logits, logit_stats
from harness.measure.timing import step_stats, timed_steps

ATTENTION_KINDS = ("xla", "splash", "flash")
Z_LOSS = 1e-4
"""z-loss weight of the timed objective (cross-entropy + z-loss, the xent loss's terms)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
    """Rows and length of one micro-batch."""

    batch: int
    """Rows."""
    seq: int
    """Positions per row."""

    @property
    def label(self) -> str:
        return f"{self.batch}x{self.seq}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Variant:
    """One attention implementation: 'xla', or a kernel at its block sizes."""

    kind: str
    """"xla", "splash" or "flash"."""
    block_q: int = 0
    """Query rows per block (kernels only)."""
    block_kv: int = 0
    """Keys per block (kernels only)."""

    @property
    def label(self) -> str:
        return self.kind if self.kind == "xla" else f"{self.kind}:{self.block_q}x{self.block_kv}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timing:
    """One variant at one shape."""

    part: str
    """"attention" or "loss"."""
    variant: str
    """The variant's label ("xla", "splash:512x1024", "chunk:256", "whole")."""
    shape: str
    """BATCHxSEQ."""
    median_ms: float
    """Median wall time of one forward + backward, blocking on its outputs."""
    min_ms: float
    max_ms: float
    steps: int
    compile_s: float
    """Seconds to lower and compile it."""
    temp_bytes: int | None
    """XLA's planned temporary bytes of the compiled program (None without the analysis)."""
    rel_l2: float
    """||value and gradients - the plain variant's|| / ||the plain variant's|| (float64)."""


def parse_shapes(text: str) -> list[Shape]:
    """'2x1024,1x4096' -> shapes; one ValueError naming the fix otherwise."""
    shapes = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        match = re.fullmatch(r"(\d+)x(\d+)", item)
        if not match or min(int(match[1]), int(match[2])) < 1:
            raise ValueError(f"--shapes {item!r}: give BATCHxSEQ with positive numbers, e.g. "
                             "2x1024,1x4096")
        shapes.append(Shape(batch=int(match[1]), seq=int(match[2])))
    if not shapes:
        raise ValueError("--shapes gives no shape; e.g. --shapes 2x1024,1x4096")
    return shapes


def parse_variants(text: str) -> list[Variant]:
    """'xla,splash:512x1024,flash:512x512' -> variants; one ValueError naming the fix."""
    variants = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        kind, _, blocks = item.partition(":")
        match = re.fullmatch(r"(\d+)x(\d+)", blocks)
        if kind == "xla" and not blocks:
            variants.append(Variant(kind="xla"))
        elif kind in ATTENTION_KINDS[1:] and match and min(int(match[1]), int(match[2])):
            variants.append(Variant(kind=kind, block_q=int(match[1]), block_kv=int(match[2])))
        else:
            raise ValueError(f"--attention {item!r}: give xla, splash:QxKV or flash:QxKV "
                             "(query rows x keys per block), e.g. xla,splash:512x1024")
    return variants


def parse_chunks(text: str) -> list[int]:
    """'0,256,512' -> positions per chunk (0: the whole logits)."""
    try:
        chunks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--logits-chunks {text!r}: give whole numbers, e.g. 0,256") from None
    if any(c < 0 for c in chunks):
        raise ValueError(f"--logits-chunks {text!r}: give 0 (whole logits) or positions > 0")
    return chunks


@dataclasses.dataclass(frozen=True, kw_only=True)
class Skipped:
    """A variant left out at one shape: its blocks (or chunk) do not tile that length."""

    part: str
    """"attention" or "loss"."""
    variant: str
    shape: str
    why: str
    """The tiling rule's own words."""


def _tiling_error(part: str, variant, seq: int) -> str | None:
    """Why `variant` (an attention Variant, or a loss chunk) cannot tile `seq`, or None."""
    try:
        if part == "loss":
            check_chunk(variant, seq)
        elif variant.kind != "xla":
            check_tiles(variant.kind, seq, variant.block_q, variant.block_kv)
    except ValueError as err:
        return str(err)
    return None


def plan(shapes: list[Shape], variants: list[Variant], chunks: list[int]
         ) -> tuple[dict[str, tuple[list[Variant], list[int]]], list[Skipped]]:
    """Per shape label, the attention variants and loss chunks that tile its length, and what
    is skipped where (a 2048-key block at 1024 positions). Refused, before anything
    compiles, with one ValueError naming the fix: a block that is no multiple of the lane
    width (at every length, so at none), and a variant or chunk that tiles none of the
    shapes."""
    runs, skipped = {}, []
    for shape in shapes:
        runs[shape.label] = ([], [])
        for part, items in (("attention", variants), ("loss", chunks)):
            for item in items:
                why = _tiling_error(part, item, shape.seq)
                if why is None:
                    runs[shape.label][part == "loss"].append(item)
                else:
                    label = item.label if part == "attention" else f"chunk:{item}"
                    skipped.append(Skipped(part=part, variant=label, shape=shape.label,
                                           why=why))
    for part, items in (("attention", variants), ("loss", chunks)):
        for item in items:
            whys = [_tiling_error(part, item, shape.seq) for shape in shapes]
            if all(whys):
                raise ValueError(whys[0])
    return runs, skipped


def _time(fn: Callable, args: tuple, steps: int, warmup: int) -> tuple:
    """(outputs, step stats, compile seconds, planned temp bytes) of jit(fn)(*args)."""
    start = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - start
    outputs = compiled(*args)
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    samples, _, _ = timed_steps(lambda: compiled(*args), steps, jax.block_until_ready)
    try:
        temp = compiled.memory_analysis().temp_size_in_bytes
    except Exception:  # a backend without the analysis
        temp = None
    return outputs, step_stats(samples), compile_s, temp


def _rel_l2(found, expected) -> float:
    pairs = list(zip(jax.tree.leaves(found), jax.tree.leaves(expected), strict=True))
    diff = sum(float(np.sum((np.asarray(a, np.float64) - np.asarray(b, np.float64))**2))
               for a, b in pairs)
    ref = sum(float(np.sum(np.asarray(b, np.float64)**2)) for _, b in pairs)
    return float(np.sqrt(diff / ref)) if ref else float(np.sqrt(diff))


def attention_inputs(config: DecoderConfig, shape: Shape, seed: int = 0) -> tuple:
    """q, k, v of one layer in the compute dtype, the rows' segment ids (two documents a
    row, as the workload packs them) and the XLA path's mask."""
    rng = np.random.default_rng(seed)
    b, length, kv, h = shape.batch, shape.seq, config.num_kv_heads, config.head_dim
    groups = config.num_heads // kv
    dt = config.compute_dtype
    q = jnp.asarray(rng.standard_normal((b, length, kv, groups, h)), dt)
    k, v = (jnp.asarray(rng.standard_normal((b, length, kv, h)), dt) for _ in range(2))
    cuts = rng.integers(1, length, b) if length > 1 else np.zeros(b, int)
    segments = jnp.asarray(1 + (np.arange(length)[None, :] >= cuts[:, None]), jnp.int32)
    return q, k, v, segments, attention_mask(segments)


def attention_step(variant: Variant, interpret: bool) -> Callable:
    """(q, k, v, segment ids, mask) -> (sum of the output, its gradient w.r.t. q, k, v)."""
    def attention(q, k, v, segments, mask):
        if variant.kind == "xla":
            return attend(q, k, v, mask)
        if variant.kind == "splash":
            return splash(q, k, v, segments, block_q=variant.block_q,
                          block_kv=variant.block_kv, interpret=interpret)
        return flash(q, k, v, segments, block_q=variant.block_q, block_kv=variant.block_kv)

    def objective(q, k, v, segments, mask):
        return jnp.sum(attention(q, k, v, segments, mask).astype(jnp.float32))

    return jax.value_and_grad(objective, argnums=(0, 1, 2))


def loss_inputs(config: DecoderConfig, shape: Shape, seed: int = 0) -> tuple:
    """Final hidden states [B, L, D] in the compute dtype, the head as stored (the tied
    embedding [V, D] or the untied head [D, V], parameter dtype) and target ids."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((shape.batch, shape.seq, config.embed_dim)),
                    config.compute_dtype)
    stored = ((config.vocab_size, config.embed_dim) if config.tie_embeddings
              else (config.embed_dim, config.vocab_size))
    head = jnp.asarray(0.02 * rng.standard_normal(stored), config.storage_dtype)
    targets = jnp.asarray(rng.integers(0, config.vocab_size, (shape.batch, shape.seq)),
                          jnp.int32)
    return x, head, targets


def loss_step(config: DecoderConfig, chunk: int) -> Callable:
    """(x, head, targets) -> (cross-entropy + z-loss sum, its gradient w.r.t. x and head),
    through the whole logits (chunk 0, as the decoder computes them) or in chunks."""
    layout = "VD" if config.tie_embeddings else "DV"
    dt = config.compute_dtype

    def objective(x, head, targets):
        if chunk:
            logprob, logz = chunked_logprobs(x, head, targets, chunk=chunk, dtype=dt,
                                             layout=layout)
        else:
            head_DxV = head.T if config.tie_embeddings else head
            logprob, logz = logit_stats(head_logits(x, head_DxV, dt), targets)
        return -jnp.sum(logprob) + Z_LOSS * jnp.sum(jnp.square(logz))

    return jax.value_and_grad(objective, argnums=(0, 1))


def _timing(part: str, label: str, shape: Shape, measured: tuple, reference,
            steps: int) -> Timing:
    outputs, stats, compile_s, temp = measured
    return Timing(part=part, variant=label, shape=shape.label, median_ms=stats.median_ms,
                  min_ms=stats.min_ms, max_ms=stats.max_ms, steps=steps, compile_s=compile_s,
                  temp_bytes=temp, rel_l2=_rel_l2(outputs, reference))


def time_attention(config: DecoderConfig, shape: Shape, variants: list[Variant], *,
                   steps: int, warmup: int) -> list[Timing]:
    """Each attention variant at `shape`, XLA first (every variant's rel_l2 is against it)."""
    from jax.experimental.pallas import tpu as pltpu

    interpret = jax.default_backend() != "tpu"
    inputs = attention_inputs(config, shape)
    found, reference = [], None
    for variant in [Variant(kind="xla"), *(v for v in variants if v.kind != "xla")]:
        if variant.kind == "flash" and interpret:  # flash has no interpret switch of its own
            with pltpu.force_tpu_interpret_mode():
                measured = _time(attention_step(variant, interpret), inputs, steps, warmup)
        else:
            measured = _time(attention_step(variant, interpret), inputs, steps, warmup)
        reference = measured[0] if reference is None else reference
        found.append(_timing("attention", variant.label, shape, measured, reference, steps))
    return found


def time_loss(config: DecoderConfig, shape: Shape, chunks: list[int], *, steps: int,
              warmup: int) -> list[Timing]:
    """The head and loss statistics at `shape`, whole logits first, then each chunk size."""
    inputs = loss_inputs(config, shape)
    found, reference = [], None
    for chunk in [0, *(c for c in chunks if c)]:
        measured = _time(loss_step(config, chunk), inputs, steps, warmup)
        reference = measured[0] if reference is None else reference
        found.append(_timing("loss", f"chunk:{chunk}" if chunk else "whole", shape, measured,
                             reference, steps))
    return found


def run(config: DecoderConfig, shapes: list[Shape], *, variants: list[Variant],
        chunks: list[int] | None, steps: int, warmup: int
        ) -> tuple[list[Timing], list[Skipped]]:
    """Every attention variant and (unless `chunks` is None) every loss variant at every
    shape whose length it tiles (`plan`), and what was skipped where."""
    if steps < 1 or warmup < 0:
        raise ValueError(f"--steps {steps} --warmup {warmup}: give at least 1 timed step and "
                         "0 or more warmup runs")
    runs, skipped = plan(shapes, variants, chunks or [])
    found = []
    for shape in shapes:
        tiled_variants, tiled_chunks = runs[shape.label]
        if variants:
            found += time_attention(config, shape, tiled_variants, steps=steps, warmup=warmup)
        if chunks is not None:
            found += time_loss(config, shape, tiled_chunks, steps=steps, warmup=warmup)
    return found, skipped


def fastest(timings: list[Timing]) -> list[str]:
    """Per part and shape, the fastest variant and its time against the plain one's."""
    lines = []
    for key in dict.fromkeys((t.part, t.shape) for t in timings):
        group = [t for t in timings if (t.part, t.shape) == key]
        best, plain = min(group, key=lambda t: t.median_ms), group[0]
        lines.append(f"{key[0]} {key[1]}: fastest {best.variant} {best.median_ms:.3f} ms, "
                     f"{best.median_ms / plain.median_ms:.3f}x of {plain.variant}")
    return lines
