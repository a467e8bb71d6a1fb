"""Which arm the report's speedups and memory ratios are taken against.

The default is the first arm of `PREFERENCE` present that passes gradient parity in every
cell (a speedup against an arm that computes another gradient compares unlike work): the
trainer this project exists to beat on the real model first, then the same trainer on our
model, then the no-host-overhead limit, then the other named arms. Arms not in the list
(TRAINER:MODEL pairs, plugin arms) follow in name order. `parity report --baseline-arm`
overrides it.
"""

from __future__ import annotations

from collections.abc import Iterable

PREFERENCE: tuple[str, ...] = ("peft-maxtext", "peft-decoder", "native", "maxtext-engine",
                               "peft-tunix", "engine-fused", "engine")
"""peft-maxtext: Tunix's PeftTrainer on MaxText's Qwen3 (the design card's reference);
peft-decoder: the same trainer on our decoder; native: one jitted step (the straightforward
way); then MaxText's own engine, PeftTrainer on Tunix's Qwen3, and our engine (fused, then
split)."""


def order(arms: Iterable[str]) -> list[str]:
    """`arms` (deduplicated) in baseline preference order."""
    present = list(dict.fromkeys(arms))
    ranked = [a for a in PREFERENCE if a in present]
    return ranked + sorted(a for a in present if a not in PREFERENCE)


def default(arms: Iterable[str]) -> str:
    """The first arm of `arms` in preference order (ValueError when there is none)."""
    ranked = order(arms)
    if not ranked:
        raise ValueError("no arms to take a baseline from")
    return ranked[0]


def check(baseline_arm: str, arms: Iterable[str]) -> str:
    """`baseline_arm` if it is among `arms`, else one ValueError naming the arms present."""
    present = list(dict.fromkeys(arms))
    if baseline_arm not in present:
        raise ValueError(f"baseline arm {baseline_arm!r} has no records here; arms present: "
                         f"{', '.join(present)}")
    return baseline_arm


def describe() -> str:
    """The preference order as the report and `--help` state it."""
    return (f"the first arm present that passes gradient parity in every cell, of "
            f"{', '.join(PREFERENCE)}, then the rest by name")
