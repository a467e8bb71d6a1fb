"""The workload losses by name (`--loss`)."""

from __future__ import annotations

from collections.abc import Callable

from arms.workload.losses import ClippedPolicyGradient, LossFn, TokenCrossEntropy
from arms.workload.tunix_grpo import TunixGrpo

LOSSES: dict[str, Callable[..., LossFn]] = {
    "xent": TokenCrossEntropy,
    "grpo": ClippedPolicyGradient,
    "tunix-grpo": TunixGrpo,
}


def get_loss(name: str, **options) -> LossFn:
    if name not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; valid losses: {', '.join(LOSSES)}")
    return LOSSES[name](**options)
