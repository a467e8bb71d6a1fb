"""The four Tunix trainer datatypes MaxText's training engine imports, for a Tunix without them.

`maxtext.training_engine.abstract_engine` (maxtext 0.2.5) imports `TrainerPayload` and
`RLTrainerPayload` from `tunix.experimental.common.datatypes` and `LossOutput` and
`WeightedMetric` from `tunix.sft.utils`; those exist in Tunix's development tree but not in
google-tunix 0.1.7 on PyPI. `install()` provides them, written here from their interface,
only where the installed Tunix lacks them: a Tunix that has them is used untouched.

The contract is the one this project's workload already follows: a loss is an unreduced sum
and its denominator, reduced once (sum/sum), never a mean of means.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

DATATYPES_MODULE = "tunix.experimental.common.datatypes"
UTILS_MODULE = "tunix.sft.utils"


@flax.struct.dataclass
class WeightedMetric:
    """A metric reduced by weight: `unreduced_sum / denominator`, 0 where the denominator is
    0 (after `eps` is added and `min_denom` bounds it)."""

    unreduced_sum: jax.Array
    """Scalar sum of the metric over its tokens or examples."""
    denominator: jax.Array
    """Scalar weight (e.g. loss-token count) the sum is divided by."""
    eps: float | None = flax.struct.field(default=None, pytree_node=False)
    """Added to the denominator before dividing, if set."""
    min_denom: float | None = flax.struct.field(default=None, pytree_node=False)
    """Lower bound of the denominator, if set."""

    def compute_scale(self) -> jax.Array:
        """1 / denominator (with eps and min_denom applied); 0 for a zero denominator."""
        denominator = self.denominator
        if self.eps is not None:
            denominator = denominator + self.eps
        if self.min_denom is not None:
            denominator = jnp.maximum(denominator, self.min_denom)
        nonzero = denominator != 0
        return jnp.where(nonzero, 1.0 / jnp.where(nonzero, denominator, 1.0), 0.0)

    def compute(self) -> jax.Array:
        """The reduced value: unreduced_sum x compute_scale()."""
        return self.unreduced_sum * self.compute_scale()


@flax.struct.dataclass
class LossOutput:
    """What a trainer's loss returns: the differentiated metric and named aux metrics."""

    primary_loss: WeightedMetric
    """The objective (its unreduced sum is what gets differentiated)."""
    aux_metrics: dict[str, WeightedMetric] = flax.struct.field(default_factory=dict)
    """Logged metrics, reduced by their own denominators."""


@flax.struct.dataclass(kw_only=True, frozen=True)
class TrainerPayload:
    """Base of every payload a trainer's fwd_bwd takes (no fields of its own)."""


@flax.struct.dataclass(kw_only=True, frozen=True)
class RLTrainerPayload(TrainerPayload):
    """A prompt/completion-split RL micro-batch ([batch, length] arrays)."""

    prompt_ids: jax.Array
    prompt_mask: jax.Array
    completion_ids: jax.Array
    completion_mask: jax.Array
    advantages: jax.Array
    segment_ids: jax.Array | None = None
    segment_positions: jax.Array | None = None
    ref_per_token_logps: jax.Array | None = None
    old_per_token_logps: jax.Array | None = None
    rollout_per_token_logps: jax.Array | None = None
    sampler_is_weights: jax.Array | None = None
    overlong: jax.Array | None = None
    routed_experts: jax.Array | None = None
    returns: jax.Array | None = None
    old_values: jax.Array | None = None
    num_segments: int | None = flax.struct.field(default=None, pytree_node=False)
    metadata: Any = flax.struct.field(default=None, pytree_node=False)


def missing() -> list[str]:
    """Which of the four datatypes the installed Tunix lacks (empty: nothing to install)."""
    import importlib

    gaps = []
    try:
        importlib.import_module(DATATYPES_MODULE)
    except ImportError:
        gaps += ["TrainerPayload", "RLTrainerPayload"]
    utils = importlib.import_module(UTILS_MODULE)
    gaps += [name for name in ("LossOutput", "WeightedMetric") if not hasattr(utils, name)]
    return gaps


def install() -> list[str]:
    """Registers this module's classes where Tunix lacks them; returns the names installed.

    Idempotent; a Tunix that already has a datatype keeps its own.
    """
    import importlib

    gaps = missing()
    if "TrainerPayload" in gaps:
        parent = "tunix"
        for name in ("experimental", "common", "datatypes"):
            full = f"{parent}.{name}"
            module = sys.modules.get(full) or types.ModuleType(full)
            if name == "datatypes":
                module.TrainerPayload, module.RLTrainerPayload = TrainerPayload, RLTrainerPayload
                module.__doc__ = f"Provided by {__name__} (this Tunix has no such module)."
            sys.modules[full] = module
            setattr(sys.modules[parent], name, module)
            parent = full
    utils = importlib.import_module(UTILS_MODULE)
    for name in ("LossOutput", "WeightedMetric"):
        if name in gaps:
            setattr(utils, name, globals()[name])
    return gaps
