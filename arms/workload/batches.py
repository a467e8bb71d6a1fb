"""Deterministic micro-batches (packed, optionally ragged) and their sha256 digests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np


class MicroBatch(NamedTuple):
    """One micro-batch; every array is [batch, seq]. GRPO fields are None for cross-entropy."""

    tokens: jax.Array
    """Input token ids (int32)."""
    targets: jax.Array
    """Next-token ids the loss scores (int32)."""
    positions: jax.Array
    """Position of each token inside its packed segment (int32, restarts at 0 per segment)."""
    segment_ids: jax.Array
    """Packed-document id per token (int32, >= 1); attention never crosses segments."""
    loss_mask: jax.Array
    """Per-token loss weight (float32); its sum is the micro-batch's denominator."""
    advantages: jax.Array | None = None
    """GRPO: per-token advantage (float32)."""
    old_logprobs: jax.Array | None = None
    """GRPO: log-prob of each target under the behaviour policy (float32)."""
    ref_logprobs: jax.Array | None = None
    """Tunix GRPO with a KL term: log-prob of each completion token under the reference
    policy (float32)."""


def _loss_mask(rng: np.random.Generator, batch_size: int, seq_len: int,
               loss_tokens: int | None, mask_fraction: float | None) -> np.ndarray:
    """Loss weights: exactly `loss_tokens` ones, or each token kept with `mask_fraction`.

    With a count, row r gets count // B (+1 for the first count % B rows) ones at its end,
    like the response tokens of a prompt/response pair.
    """
    mask = np.zeros((batch_size, seq_len), np.float32)
    if loss_tokens is not None:
        per_row, extra = divmod(loss_tokens, batch_size)
        for row in range(batch_size):
            n = per_row + (row < extra)
            if n:
                mask[row, seq_len - n:] = 1.0
        return mask
    fraction = 1.0 if mask_fraction is None else mask_fraction
    return (rng.random((batch_size, seq_len)) < fraction).astype(np.float32)


def make_micro_batches(*, seed: int, batch_size: int, seq_len: int, vocab_size: int,
                       num_micro_batches: int | None = None,
                       loss_tokens: Sequence[int] | None = None,
                       mask_fraction: float | None = None,
                       segments_per_row: int = 2,
                       grpo: bool = False) -> list[MicroBatch]:
    """`num_micro_batches` deterministic packed micro-batches of shape [batch_size, seq_len].

    `loss_tokens` (e.g. [64, 16, 40, 8]) gives each micro-batch its exact number of loss
    tokens, and so its denominator; otherwise `mask_fraction` of the tokens (default all).
    Each row packs `segments_per_row` documents with positions restarting per document.
    """
    if loss_tokens is not None:
        loss_tokens = [int(n) for n in loss_tokens]
        if num_micro_batches is None:
            num_micro_batches = len(loss_tokens)
        if len(loss_tokens) != num_micro_batches:
            raise ValueError(f"{len(loss_tokens)} ragged loss-token counts for "
                             f"{num_micro_batches} micro-batches; give one count per micro-batch")
        capacity = batch_size * seq_len
        for i, n in enumerate(loss_tokens):
            if not 0 <= n <= capacity:
                raise ValueError(
                    f"ragged count {n} (micro-batch {i}) is longer than the micro-batch holds "
                    f"({batch_size} rows x seq {seq_len} = {capacity} tokens); use counts <= "
                    f"{capacity} or a longer --seq")
    if num_micro_batches is None:
        num_micro_batches = 1
    if mask_fraction is not None and not 0.0 <= mask_fraction <= 1.0:
        raise ValueError(f"mask_fraction={mask_fraction} must lie in [0, 1]")
    if not 1 <= segments_per_row <= seq_len:
        raise ValueError(f"segments_per_row={segments_per_row} must lie in [1, seq_len]")

    rng = np.random.default_rng(seed)
    batches = []
    for i in range(num_micro_batches):
        stream = rng.integers(0, vocab_size, (batch_size, seq_len + 1), dtype=np.int32)
        segment_ids = np.ones((batch_size, seq_len), np.int32)
        positions = np.zeros((batch_size, seq_len), np.int32)
        for row in range(batch_size):
            cuts = np.sort(rng.choice(np.arange(1, seq_len), segments_per_row - 1, replace=False))
            starts = np.concatenate([[0], cuts])
            for seg, start in enumerate(starts):
                segment_ids[row, start:] = seg + 1
                positions[row, start:] = np.arange(seq_len - start)
        count = None if loss_tokens is None else loss_tokens[i]
        mask = _loss_mask(rng, batch_size, seq_len, count, mask_fraction)
        extra = {}
        if grpo:
            extra["advantages"] = rng.standard_normal((batch_size, seq_len)).astype(np.float32)
            extra["old_logprobs"] = (-np.log(vocab_size) + 0.1 * rng.standard_normal(
                (batch_size, seq_len))).astype(np.float32)
        batches.append(MicroBatch(tokens=stream[:, :-1], targets=stream[:, 1:],
                                  positions=positions, segment_ids=segment_ids, loss_mask=mask,
                                  **extra))
    return batches


def data_digest(batches: MicroBatch | Sequence[MicroBatch]) -> str:
    """sha256 over every array's name, dtype, shape and bytes: equal iff the data are equal."""
    if isinstance(batches, MicroBatch):
        batches = [batches]
    digest = hashlib.sha256()
    for batch in batches:
        for name, value in zip(MicroBatch._fields, batch, strict=True):
            if value is None:
                continue
            array = np.ascontiguousarray(jax.device_get(value))
            digest.update(f"{name}:{array.dtype}:{array.shape};".encode())
            digest.update(array.tobytes())
    return digest.hexdigest()


def denominators(batches: Sequence[MicroBatch], loss=None) -> list[float]:
    """Each micro-batch's denominator (host values): the loss's own count where it has one
    (`loss.host_denominator`), else the loss-mask sum."""
    count = getattr(loss, "host_denominator", None)
    if count is not None:
        return [count(b) for b in batches]
    return [float(np.asarray(jax.device_get(b.loss_mask)).sum()) for b in batches]


def concatenate(batches: Sequence[MicroBatch]) -> MicroBatch:
    """One batch holding all rows of `batches` (the reference for accumulation tests)."""
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=0), *batches)
