"""The shared workload: losses (sum, denominator, aux), deterministic batches, exact gradient."""

from arms.workload.batches import (
    MicroBatch,
    concatenate,
    data_digest,
    denominators,
    make_micro_batches,
)
from arms.workload.losses import (
    ClippedPolicyGradient,
    LossFn,
    LossOutput,
    TokenCrossEntropy,
    forward,
    target_logprobs,
)
from arms.workload.reference import (
    exact_by_micro_batch,
    exact_gradient,
    exact_loss_and_gradient,
    global_norm,
    max_rel_error,
    rel_l2,
)
from arms.workload.registry import LOSSES, check_decoder_options, get_loss

__all__ = [
    "LOSSES", "ClippedPolicyGradient", "LossFn", "LossOutput", "MicroBatch", "TokenCrossEntropy",
    "check_decoder_options", "concatenate", "data_digest", "denominators",
    "exact_by_micro_batch", "exact_gradient", "exact_loss_and_gradient", "forward",
    "get_loss", "global_norm", "make_micro_batches", "max_rel_error", "rel_l2",
    "target_logprobs",
]
