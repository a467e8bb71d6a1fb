"""The workload losses by name (`--loss`), and what each can take of our decoder's options."""

from __future__ import annotations

from collections.abc import Callable

from arms.workload.losses import ClippedPolicyGradient, LossFn, TokenCrossEntropy
from arms.workload.tunix_grpo import TunixGrpo
from engine.model import DecoderConfig, check_sequence

LOSSES: dict[str, Callable[..., LossFn]] = {
    "xent": TokenCrossEntropy,
    "grpo": ClippedPolicyGradient,
    "tunix-grpo": TunixGrpo,
}

WHOLE_LOGITS = ("tunix-grpo",)
"""Losses that take the model's whole [B, L, V] logits, so cannot take `logits_chunk`: Tunix's
`grpo_loss_fn` calls the model for its logits and computes its log-probs and its entropy
diagnostic from them itself."""


def get_loss(name: str, **options) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {', '.join(LOSSES)}")
    return LOSSES[name](**options)


def check_decoder_options(loss: str, config: DecoderConfig, seq: int) -> None:
    """Raises one ValueError where `config`'s attention blocks or logits chunk cannot tile
    `seq`, or the loss cannot take the chunked logits."""
    check_sequence(config, seq)
    if config.logits_chunk and loss in WHOLE_LOGITS:
        raise ValueError(f"--logits-chunk {config.logits_chunk} with --loss {loss}: Tunix's "
                         "grpo_loss_fn takes the model's whole logits (its log-probs and "
                         "entropy are its own code); chunks apply to the xent and grpo losses. "
                         "Pass --logits-chunk 0")
