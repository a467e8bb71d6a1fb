"""Tunix's own GRPO loss (`tunix.rl.algo_core.grpo_loss_fn`) as a workload loss.

The function is called as Tunix's GRPO learner calls it, on a `TrainExample` cut from a
rollout micro-batch (`arms.workload.rollouts`), with Tunix's `GRPOConfig`, and returns one
aggregated value. The workload contract needs a sum and its denominator, so that
accumulation over micro-batches is exact; both are obtained from Tunix's value itself:

- `token-mean` averages the per-token loss over the micro-batch's completion tokens n, so
  value x n is their sum, and sum_i / sum_i n_i is token-mean over the whole step;
- every other mode (`sequence-mean-token-mean`, `sequence-mean-token-scale`,
  `seq-mean-token-sum`, `sequence-mean-token-sum-norm`) divides a sum of per-row terms by the
  number r of rows holding at least one completion token (each row's term depends on that
  row alone: its own token count, or the fixed completion length), so value x r and r
  decompose the same way.

Where a micro-batch has no such token or row, Tunix divides by 1 (its clamp) a sum of zeros:
value x 0 = 0 adds nothing, as it must. Aux values are Tunix's aggregated diagnostics that
share the loss's aggregation (its policy-gradient, KL and entropy terms), times the same
denominator.

Models are called as Tunix calls them (`arms.workload.tunix_call`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from arms.workload.batches import MicroBatch
from arms.workload.losses import LossOutput
from arms.workload.rollouts import EOS_ID, PAD_ID, prompt_len
from arms.workload.tunix_call import tunix_module

TOKEN_MEAN = "token-mean"
ROW_MODES = ("sequence-mean-token-mean", "sequence-mean-token-scale", "seq-mean-token-sum",
             "sequence-mean-token-sum-norm")
"""Aggregation modes whose value is a sum over non-empty rows divided by their count."""
AGG_MODES = (TOKEN_MEAN, *ROW_MODES)
DIAGNOSTICS = ("pg_loss", "kl_loss", "entropy")
"""Tunix's aux values aggregated with the loss's own mode (so x denominator is a sum)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TunixGrpo:
    """`tunix.rl.algo_core.grpo_loss_fn` on rollout micro-batches, as (sum, denominator)."""

    loss_agg_mode: str = TOKEN_MEAN
    """Tunix's `loss_agg_mode` (AGG_MODES)."""
    beta: float = 0.0
    """KL penalty weight; > 0 needs the batch's reference log-probs."""
    epsilon: float = 0.2
    """Lower clip of the importance ratio (1 - epsilon)."""
    epsilon_high: float | None = None
    """Upper clip (1 + epsilon_high); None: epsilon."""
    epsilon_c: float | None = None
    """Dual-clip bound on a negative advantage's loss; None: no dual clip."""

    name = "tunix-grpo"

    def __post_init__(self):
        if self.loss_agg_mode not in AGG_MODES:
            raise ValueError(f"--loss-agg-mode {self.loss_agg_mode!r} is not one of Tunix's "
                             f"aggregation modes with a sum/denominator decomposition: "
                             f"{', '.join(AGG_MODES)}")
        if self.beta < 0 or self.epsilon < 0 or (self.epsilon_high or 0) < 0:
            raise ValueError("--beta, --epsilon and --epsilon-high must be >= 0")
        if self.epsilon_c is not None and self.epsilon_c <= 1:
            raise ValueError(f"--epsilon-c {self.epsilon_c}: the dual clip bound must be > 1")

    def algo_config(self):
        """Tunix's GRPOConfig for these options (temperature 1, as the learner sets it from
        the rollout; epsilon_high / epsilon_c as attributes, read where present)."""
        from tunix.rl.grpo.grpo_learner import GRPOConfig

        config = GRPOConfig(loss_agg_mode=self.loss_agg_mode, beta=self.beta,
                            epsilon=self.epsilon)
        config.temperature = 1.0
        config.epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
        if self.epsilon_c is not None:
            config.epsilon_c = self.epsilon_c
        return config

    def train_example(self, batch: MicroBatch):
        """Tunix's TrainExample of a rollout micro-batch (its fields as the learner builds
        them: bool masks, one advantage per row)."""
        from tunix.rl.common import TrainExample

        if batch.advantages is None or batch.old_logprobs is None:
            raise ValueError("the tunix-grpo loss needs rollout micro-batches with advantages "
                             "and old log-probs (arms.workload.rollouts)")
        if self.beta and batch.ref_logprobs is None:
            raise ValueError("--beta > 0 needs reference log-probs in the micro-batches")
        p = prompt_len(batch.tokens.shape[1])
        return TrainExample(
            prompt_ids=batch.tokens[:, :p], prompt_mask=batch.segment_ids[:, :p] > 0,
            completion_ids=batch.tokens[:, p:], completion_mask=batch.loss_mask[:, p:] > 0,
            advantages=batch.advantages[:, 0],
            ref_per_token_logps=batch.ref_logprobs[:, p:] if self.beta else None,
            old_per_token_logps=batch.old_logprobs[:, p:])

    def denominator(self, completion_mask_BxC) -> jax.Array:
        """This mode's denominator of a micro-batch: its completion tokens (token-mean) or
        its rows holding at least one (every other mode), as float32."""
        mask = jnp.asarray(completion_mask_BxC, jnp.float32)
        if self.loss_agg_mode == TOKEN_MEAN:
            return jnp.sum(mask)
        return jnp.sum((jnp.sum(mask, axis=-1) > 0).astype(jnp.float32))

    def __call__(self, model, batch: MicroBatch) -> LossOutput:
        from tunix.rl import algo_core

        example = self.train_example(batch)
        value, aux = algo_core.grpo_loss_fn(tunix_module(model), example, self.algo_config(),
                                            PAD_ID, EOS_ID)
        den = self.denominator(example.completion_mask)
        sums = {f"{name}_sum": jnp.asarray(aux[name], jnp.float32) * den for name in DIAGNOSTICS
                if name != "kl_loss" or self.beta}
        return LossOutput(jnp.asarray(value, jnp.float32) * den, den, sums)

    def host_denominator(self, batch: MicroBatch) -> float:
        """The denominator of `batch` on the host (what the parity record lists)."""
        p = prompt_len(batch.tokens.shape[1])
        return float(self.denominator(jax.device_get(batch.loss_mask)[:, p:] > 0))
