"""The output head and the per-token statistics the workload losses read: the log-probability
of each target and the log-normalizer (logsumexp of the logits), computed from the final
hidden states either through the whole [B, L, V] float32 logits at once or a chunk of
positions at a time (`DecoderConfig.logits_chunk`).

In chunks, a `lax.scan` over the sequence computes each chunk's [B, C, V] logits, reduces
them to the two [B, C] statistics and drops them; its body is rematerialized
(`jax.checkpoint`), so the backward pass recomputes a chunk's logits from its hidden states
instead of keeping them: at no point, forward or backward, does more than one chunk's
float32 logits (or their gradient) exist. The price: the head's forward matmul once more
(2 x B x L x D x V FLOPs), and the head's gradient summed over the chunks in a buffer of the
head's shape and stored dtype carried through the scan (float32 [V, D]: 4 x V x D bytes,
read and written once per chunk). Memory is saved where the float32 logits and their
gradient (2 x 4 x B x L x V bytes) outweigh that sum, i.e. where a micro-batch holds more
tokens than the model is wide (B x L > D); below, the chunks cost memory.

Each token's statistics reduce the same V logits as the whole computation, so the values
agree to float32 round-off (the matmul's blocking may differ); the head's gradient is a sum
over chunks where the whole computation sums all positions in one product, which reorders
float32 additions.

Tensor names carry their shape: B batch, L length, C positions per chunk, D embed, V vocab.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from engine.model.sharding import constrain

LOGITS_AXES = ("activation_batch", "activation_length", "activation_vocab")


def head_logits(x_BxLxD: jax.Array, head: jax.Array, dtype, layout: str = "DV") -> jax.Array:
    """float32 logits of the hidden states: the product with the head (`layout` "DV" for a
    [D, V] head, "VD" for a [V, D] one such as a tied embedding) in `dtype`, then cast."""
    logits_BxLxV = jnp.einsum(f"BLD,{layout}->BLV", x_BxLxD, head.astype(dtype))
    return constrain(logits_BxLxV.astype(jnp.float32), LOGITS_AXES)


def logit_stats(logits_BxLxV: jax.Array, targets_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(log p(target), logsumexp of the logits) per position, float32."""
    logz_BxL = jax.nn.logsumexp(logits_BxLxV, axis=-1)
    target_logit_BxL = jnp.take_along_axis(logits_BxLxV, targets_BxL[..., None], axis=-1)[..., 0]
    return target_logit_BxL - logz_BxL, logz_BxL


def check_chunk(chunk: int, seq: int) -> None:
    """Raises one ValueError naming the fix where `chunk` positions do not tile `seq`."""
    if chunk and seq % chunk:
        divisors = [d for d in range(1, seq + 1) if not seq % d and d <= chunk]
        raise ValueError(f"logits_chunk={chunk} does not divide seq {seq}: the loss scans the "
                         f"sequence in chunks of equal length; pass --logits-chunk with a "
                         f"divisor of {seq} (e.g. {max(divisors)}), or 0 for the whole logits")


def chunked_logprobs(x_BxLxD: jax.Array, head: jax.Array, targets_BxL: jax.Array, *,
                     chunk: int, dtype, layout: str = "DV") -> tuple[jax.Array, jax.Array]:
    """(log p(target), logsumexp) per position of logits = x . head (product in `dtype`,
    logits float32, `layout` as in `head_logits`), `chunk` positions of every row at a time
    (module docstring). The head is taken in its stored dtype and layout and cast inside each
    chunk: its gradient accumulates over the chunks in that dtype (float32 parameters: a
    float32 sum), and a tied embedding is read as it is stored, never transposed."""
    b, length, d = x_BxLxD.shape
    check_chunk(chunk, length)
    n = length // chunk
    x_NxBxCxD = x_BxLxD.reshape(b, n, chunk, d).swapaxes(0, 1)
    targets_NxBxC = targets_BxL.reshape(b, n, chunk).swapaxes(0, 1)

    @functools.partial(jax.checkpoint, prevent_cse=False)  # the scan keeps chunks apart
    def one_chunk(x_BxCxD, targets_BxC):
        return logit_stats(head_logits(x_BxCxD, head, dtype, layout), targets_BxC)

    def step(carry, chunk_inputs):
        return carry, one_chunk(*chunk_inputs)

    _, (logprob_NxBxC, logz_NxBxC) = jax.lax.scan(step, None, (x_NxBxCxD, targets_NxBxC))
    return (logprob_NxBxC.swapaxes(0, 1).reshape(b, length),
            logz_NxBxC.swapaxes(0, 1).reshape(b, length))
