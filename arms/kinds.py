"""What an arm can be made of: the model kinds and the trainers, as data.

A leaf of the package (it imports no arm): the registry (`arms.registry`) resolves names
against these tables and imports a trainer's class only when an arm of it is made, and every
arm (`arms.base`) reads its own description here.
"""

from __future__ import annotations

import dataclasses

MODELS: dict[str, str] = {
    "decoder": "our MaxText-style decoder",
    "maxtext": "the real MaxText Qwen3 (maxtext)",
    "tunix": "Tunix's Qwen3",
}
"""Model kinds -> what the report calls them. All hold the same weights."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trainer:
    """One trainer: where its Arm class lives and which model kinds it can drive."""

    name: str
    """Registry name (the TRAINER of TRAINER:MODEL)."""
    cls: str
    """'module:Class' of its Arm subclass, imported when an arm is made."""
    about: str
    """What it is, as the report names it."""
    models: tuple[str, ...] = tuple(MODELS)
    """Model kinds it drives; a trainer with one kind has no TRAINER:MODEL pairs."""


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer(name="engine", cls="arms.engine_arm:EngineArm",
            about="our TrainingEngine (split fwd_bwd + update)"),
    Trainer(name="engine-fused", cls="arms.engine_arm:FusedEngineArm",
            about="our TrainingEngine (fused train_step)"),
    Trainer(name="native", cls="arms.native:NativeArm",
            about="one jitted step (the straightforward way)"),
    Trainer(name="peft", cls="arms.peft:PeftArm", about="Tunix's PeftTrainer"),
    Trainer(name="maxtext-engine", cls="arms.maxtext_engine:MaxTextEngineArm",
            about="MaxText's MaxTextTrainingEngine", models=("maxtext",)),
)}


def describe(trainer: str, model: str) -> str:
    """'<trainer> on <model>' in words, for the record and the report."""
    known = TRAINERS.get(trainer)
    return f"{known.about if known else 'plugin arm ' + trainer} on {MODELS[model]}"
