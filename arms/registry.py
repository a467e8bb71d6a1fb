"""The one registry of arms: trainers, model kinds, the named arms, and plugin arms.

An arm is a trainer driving a model kind. Every trainer and model kind is declared once, as
data, in `arms.kinds` (a trainer's class is imported only when an arm of it is made, so
listing arms imports no trainer, Tunix or MaxText); named arms, `TRAINER:MODEL` pairs, the
CLI's `--arms` help and its default list all derive from those tables. A name is resolved
once (`lookup`) into an `ArmChoice` that the caller hands on. Plugin modules add arms by
name with `register`.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from arms.kinds import MODELS, TRAINERS, Trainer

if TYPE_CHECKING:
    from arms.base import Arm
    from arms.requirements import Found
    from arms.spec import CellSpec

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


@dataclasses.dataclass(frozen=True)
class ArmChoice:
    """An arm name resolved once (`lookup`): its trainer and model kind, and what is done
    with it (import what it needs, make it, say why it cannot run here) without resolving
    the name again."""

    name: str
    """The name as given ('peft-tunix', 'engine:tunix', or a plugin arm's)."""
    trainer: str
    """Registry name of its trainer, or the plugin arm's own name."""
    model: str
    """Its model kind (MODELS), or PLUGIN."""

    @property
    def plugin(self) -> bool:
        """A plugin arm builds its own (no abstract build, no options)."""
        return self.model == PLUGIN

    def arm_class(self) -> type[Arm]:
        module, _, name = TRAINERS[self.trainer].cls.partition(":")
        return getattr(importlib.import_module(module), name)

    def preload(self) -> None:
        """Imports what the arm needs (its trainer's module and its model's packages)
        without building anything, so a caller can time imports apart from the build."""
        if self.plugin:
            return
        self.arm_class()
        if self.model == "maxtext":
            from arms.models.maxtext_qwen3 import require_maxtext

            require_maxtext(engine=self.trainer == "maxtext-engine")
        elif self.model == "tunix":
            from arms.models.tunix_qwen3 import tunix_model

            tunix_model()

    def make(self, spec: CellSpec, **options) -> Arm:
        """The unbuilt arm for `spec`; call `.build()` to compile it (or `.plan()`).
        `options` go to the Arm (`devices`); a plugin arm takes none."""
        if not self.plugin:
            return self.arm_class()(spec, self.model, **options)
        try:
            return _PLUGINS[self.name](spec, **options)
        except TypeError:
            if not options:
                raise
            raise ValueError(f"plugin arm {self.name!r} takes no {', '.join(options)}: its "
                             "factory cannot build it for another mesh (a plan)") from None

    def cannot_share_a_process(self) -> str:
        """Why this arm cannot share a process with other arms ('' when it can): its trainer
        or its model changes state the other arms would see."""
        return (CANNOT_SHARE_A_PROCESS.get(self.trainer)
                or CANNOT_SHARE_A_PROCESS.get(self.model, ""))

    def unavailable(self, found: Found | None = None) -> str | None:
        """Why the arm cannot run in this Python environment (one line: each package
        missing with the version needed, or the import that fails; arms.requirements), or
        None where it can. A plugin arm builds its own and is judged by its module's
        import."""
        from arms.requirements import why_unavailable

        return None if self.plugin else why_unavailable(self.trainer, self.model, found)


def lookup(name: str) -> ArmChoice:
    """'peft-tunix' or 'engine:tunix' -> its ArmChoice; a clear error lists the valid."""
    if name in _PLUGINS:
        return ArmChoice(name, name, PLUGIN)
    if name in NAMED_ARMS:
        return ArmChoice(name, *NAMED_ARMS[name])
    trainer, _, model = name.partition(":")
    if trainer in TRAINERS and model in TRAINERS[trainer].models and len(
            TRAINERS[trainer].models) > 1:
        return ArmChoice(name, trainer, model)
    raise ValueError(f"unknown arm {name!r}; valid arms: {arms_help()}")


def resolve(name: str) -> tuple[str, str]:
    """'peft-tunix' or 'engine:tunix' -> (trainer, model); a clear error lists the valid."""
    choice = lookup(name)
    return choice.trainer, choice.model


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
    """Why arm `name` cannot share a process with other arms ('' when it can)."""
    return lookup(name).cannot_share_a_process()


def arms_help() -> str:
    """The valid arm names, as one line for errors and --help."""
    pairs = [t for t in TRAINERS.values() if len(t.models) > 1]
    return (f"{', '.join([*NAMED_ARMS, *_PLUGINS])}, or any TRAINER:MODEL with TRAINER in "
            f"{{{', '.join(t.name for t in pairs)}}} and MODEL in {{{', '.join(MODELS)}}}")


def make_arm(name: str, spec: CellSpec, **options) -> Arm:
    """An unbuilt arm by name (`lookup(name).make`)."""
    return lookup(name).make(spec, **options)


def preload(name: str) -> None:
    """Imports what arm `name` needs without building anything (`ArmChoice.preload`)."""
    lookup(name).preload()


def unavailable(name: str, found: Found | None = None) -> str | None:
    """Why arm `name` cannot run in this Python environment, or None where it can."""
    return lookup(name).unavailable(found)


__all__ = ["DEFAULT_ARMS", "MODELS", "NAMED_ARMS", "PLUGIN", "TRAINERS", "ArmChoice", "Trainer",
           "arms_help", "cannot_share_a_process", "lookup", "make_arm", "preload", "register",
           "resolve", "unavailable"]
