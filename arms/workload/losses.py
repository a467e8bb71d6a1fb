"""Workload losses: each returns an unnormalized loss sum, its denominator and aux sums.

Returning sums (not means) is what makes gradient accumulation exact: the optimizer must see
sum_i grad(loss_sum_i) / sum_i denominator_i, and a mean of per-micro-batch means differs
whenever micro-batches hold different numbers of loss tokens. Aux values are sums too, so
they normalize by the same denominator. Any aux *loss* term (z-loss) is already inside
`loss_sum`, the differentiated objective; aux entries are for logging only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from arms.workload.batches import MicroBatch
from engine.model.head import logit_stats


class LossOutput(NamedTuple):
    loss_sum: jax.Array
    """Scalar float32: the objective summed over loss tokens (aux loss terms included)."""
    denominator: jax.Array
    """Scalar float32: the loss-mask sum this micro-batch contributes to normalization."""
    aux: dict[str, jax.Array]
    """Named scalar float32 sums for logging (normalized by the same denominator)."""


LossFn = Callable[[Callable, MicroBatch], LossOutput]


def forward(model, batch: MicroBatch) -> jax.Array:
    """logits_BxLxV (float32) of either decoder (ours, or an adapter with the same call)."""
    return model(batch.tokens, batch.positions, batch.segment_ids)


def target_logprobs(model, batch: MicroBatch) -> tuple[jax.Array, jax.Array]:
    """(log p(target), logsumexp of the logits) per token, float32. Our decoder computes them
    itself (`Decoder.token_logprobs`: through its whole logits, or in chunks of positions
    where its config's `logits_chunk` says so, never holding the [B, L, V] float32 logits);
    any other model (MaxText's, Tunix's) from its whole logits."""
    own = getattr(model, "token_logprobs", None)
    if own is not None:
        return own(batch.tokens, batch.positions, batch.segment_ids, batch.targets)
    return logit_stats(forward(model, batch), batch.targets)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenCrossEntropy:
    """Next-token cross-entropy, optionally with z-loss (weight * logsumexp^2 per token)."""

    z_loss_weight: float = 0.0
    """Weight of the z-loss term added to the objective; 0 disables it (nothing computed)."""

    name = "xent"

    def __call__(self, model, batch: MicroBatch) -> LossOutput:
        mask_BxL = batch.loss_mask.astype(jnp.float32)
        logprob_BxL, logz_BxL = target_logprobs(model, batch)
        xent_sum = -jnp.sum(logprob_BxL * mask_BxL)
        aux = {"xent_sum": xent_sum}
        loss_sum = xent_sum
        if self.z_loss_weight:
            z_sum = self.z_loss_weight * jnp.sum(jnp.square(logz_BxL) * mask_BxL)
            aux["z_loss_sum"] = z_sum
            loss_sum = loss_sum + z_sum
        return LossOutput(loss_sum, jnp.sum(mask_BxL), aux)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClippedPolicyGradient:
    """GRPO-style clipped surrogate: -min(r * A, clip(r, 1 - eps, 1 + eps) * A) per token."""

    clip_eps: float = 0.2
    """Clipping range of the importance ratio r = exp(logp - old_logp)."""

    name = "grpo"

    def __call__(self, model, batch: MicroBatch) -> LossOutput:
        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("the grpo loss needs micro-batches built with grpo=True "
                             "(advantages and old_logprobs)")
        mask_BxL = batch.loss_mask.astype(jnp.float32)
        logprob_BxL, _ = target_logprobs(model, batch)
        ratio_BxL = jnp.exp(logprob_BxL - batch.old_logprobs)
        clipped_BxL = jnp.clip(ratio_BxL, 1.0 - self.clip_eps, 1.0 + self.clip_eps)
        surrogate_BxL = jnp.minimum(ratio_BxL * batch.advantages, clipped_BxL * batch.advantages)
        loss_sum = -jnp.sum(surrogate_BxL * mask_BxL)
        clipped_sum = jnp.sum((ratio_BxL != clipped_BxL).astype(jnp.float32) * mask_BxL)
        return LossOutput(loss_sum, jnp.sum(mask_BxL), {"clipped_tokens_sum": clipped_sum})
