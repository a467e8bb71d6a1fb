"""The one registry of arms: trainers, model kinds, the named arms, and plugin arms.

An arm is a trainer driving a model kind. Every trainer is declared once here (its class is
imported only when an arm of it is made, so listing arms imports no trainer, Tunix or
MaxText); named arms, `TRAINER:MODEL` pairs, the CLI's `--arms` help and its default list
all derive from these tables. Plugin modules add arms by name with `register`.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from arms.base import Arm
    from arms.spec import CellSpec

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

    def arm_class(self) -> type[Arm]:
        module, _, name = self.cls.partition(":")
        return getattr(importlib.import_module(module), name)


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer(name="engine", cls="arms.engine_arm:EngineArm",
            about="our TrainingEngine (split fwd_bwd + update)"),
    Trainer(name="engine-fused", cls="arms.engine_arm:FusedEngineArm",
            about="our TrainingEngine (fused train_step)"),
    Trainer(name="native", cls="arms.native:NativeArm", about="one jitted step (the limit)"),
    Trainer(name="peft", cls="arms.peft:PeftArm", about="Tunix's PeftTrainer"),
    Trainer(name="maxtext-engine", cls="arms.maxtext_engine:MaxTextEngineArm",
            about="MaxText's MaxTextTrainingEngine", models=("maxtext",)),
)}

NAMED_ARMS: dict[str, tuple[str, str]] = {
    "engine": ("engine", "decoder"),
    "engine-fused": ("engine-fused", "decoder"),
    "native": ("native", "decoder"),
    "peft-decoder": ("peft", "decoder"),
    "peft-maxtext": ("peft", "maxtext"),
    "peft-tunix": ("peft", "tunix"),
    "maxtext-engine": ("maxtext-engine", "maxtext"),
}
"""Arm names -> (trainer, model). Any other pair is spelled TRAINER:MODEL."""

DEFAULT_ARMS: tuple[str, ...] = tuple(NAMED_ARMS)
"""What `parity run` measures when no --arms or suite says otherwise: every named arm."""

_PLUGINS: dict[str, Callable[[CellSpec], Arm]] = {}


def register(name: str, factory: Callable[[CellSpec], Arm]) -> None:
    """Adds an arm by name (e.g. a test-only arm from a plugin module)."""
    _PLUGINS[name] = factory


PLUGIN = "plugin"
"""The model kind `resolve` reports for a plugin arm (which builds its own)."""


def resolve(name: str) -> tuple[str, str]:
    """'peft-tunix' or 'engine:tunix' -> (trainer, model); a clear error lists the valid."""
    if name in _PLUGINS:
        return name, PLUGIN
    if name in NAMED_ARMS:
        return NAMED_ARMS[name]
    trainer, _, model = name.partition(":")
    if trainer in TRAINERS and model in TRAINERS[trainer].models and len(
            TRAINERS[trainer].models) > 1:
        return trainer, model
    raise ValueError(f"unknown arm {name!r}; valid arms: {arms_help()}")


CANNOT_SHARE_A_PROCESS: dict[str, str] = {
    "peft": "Tunix's PeftTrainer changes process-wide state the next trainer would inherit "
            "(it turns on flax_always_shard_variable, and its close() clears every "
            "jax.monitoring listener)",
    "maxtext-engine": "MaxText keeps its config in module globals (pyconfig), so two of its "
                      "engines in one process share one config",
    "maxtext": "the real MaxText model reads MaxText's config globals (pyconfig)",
    "tunix": "Tunix's Qwen3 is built beside Tunix's process-wide flax settings",
}
"""Trainers and model kinds whose arms cannot be built in one process with another arm
(`parity run --pairing in-process`), and why."""


def cannot_share_a_process(name: str) -> str:
    """Why arm `name` cannot share a process with other arms ('' when it can): its trainer or
    its model changes state the other arms would see."""
    trainer, model = resolve(name)
    return CANNOT_SHARE_A_PROCESS.get(trainer) or CANNOT_SHARE_A_PROCESS.get(model, "")


def arms_help() -> str:
    """The valid arm names, as one line for errors and --help."""
    pairs = [t for t in TRAINERS.values() if len(t.models) > 1]
    return (f"{', '.join([*NAMED_ARMS, *_PLUGINS])}, or any TRAINER:MODEL with TRAINER in "
            f"{{{', '.join(t.name for t in pairs)}}} and MODEL in {{{', '.join(MODELS)}}}")


def make_arm(name: str, spec: CellSpec, **options) -> Arm:
    """An unbuilt arm by name; call `.build()` to compile it (or `.plan()`). `options` go to
    the Arm (`devices`, `capture`); a plugin arm takes none."""
    if name in _PLUGINS:
        factory = _PLUGINS[name]
        if "capture" in options and not _takes(factory, "capture"):
            # a plugin that builds its own arm keeps its own capture (the check reads it)
            options = {k: v for k, v in options.items() if k != "capture"}
        try:
            return factory(spec, **options)
        except TypeError:
            if not options:
                raise
            raise ValueError(f"plugin arm {name!r} takes no {', '.join(options)}: its "
                             "factory cannot build it for another mesh (a plan)") from None
    trainer, model = resolve(name)
    return TRAINERS[trainer].arm_class()(spec, model, **options)


def _takes(factory: Callable, option: str) -> bool:
    """Whether `factory` accepts keyword `option` (by name, or through **kwargs)."""
    parameters = inspect.signature(factory).parameters.values()
    return any(p.name == option or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def preload(name: str) -> None:
    """Imports what arm `name` needs (its trainer's module and its model's packages) without
    building anything, so a caller can time imports apart from the build."""
    if name in _PLUGINS:
        return
    trainer, model = resolve(name)
    TRAINERS[trainer].arm_class()
    if model == "maxtext":
        from arms.models.maxtext_qwen3 import require_maxtext

        require_maxtext(engine=trainer == "maxtext-engine")
    elif model == "tunix":
        from arms.models.tunix_qwen3 import tunix_model

        tunix_model()


def unavailable(name: str, found: dict[str, str | None] | None = None) -> str | None:
    """Why arm `name` cannot run in this Python environment (one line naming each package,
    the version found and the one needed: arms.requirements), or None where it can. A plugin
    arm builds its own and is judged by its module's import."""
    from arms.requirements import why_unavailable

    trainer, model = resolve(name)
    if model == PLUGIN:
        return None
    return why_unavailable(trainer, model, found)
