"""The Arm protocol, the shared model builders and the registry of trainer x model pairs."""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import jax
from flax import nnx

from arms.capture import captured_gradient
from arms.spec import CellSpec
from arms.workload import MicroBatch
from engine.model import batch_sharding, build_decoder
from engine.model.sharding import place_global_batch

MODELS = ("decoder", "tunix")
"""Model kinds: our MaxText-style decoder, or Tunix's Qwen3 holding the same weights."""


def build_model(kind: str, spec: CellSpec, mesh) -> nnx.Module:
    """The model of one arm, on `mesh`; both kinds start from the same (seeded) weights."""
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; valid models: {', '.join(MODELS)}")
    decoder = build_decoder(spec.model_config(), seed=spec.seed, mesh=mesh)
    if kind == "decoder":
        return decoder
    from arms.models.tunix_qwen3 import to_tunix  # tunix is imported only by arms that use it

    return to_tunix(decoder, mesh=mesh)


class Arm(abc.ABC):
    """One trainer driving one model over the shared workload of a `CellSpec`."""

    trainer: str = ""
    """Registry name of the trainer ("engine", "engine-fused", "native", "peft")."""

    def __init__(self, spec: CellSpec, model: str = "decoder"):
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; valid models: {', '.join(MODELS)}")
        self.spec, self.model_kind = spec, model
        self.mesh = spec.make_mesh()  # refuses a mesh the model cannot use, before compiling
        self.compile_seconds = 0.0
        self.calls_per_step = 0  # executable calls the last step() dispatched

    @abc.abstractmethod
    def build(self) -> None:
        """Builds the model and trainer and compiles everything `step` will run."""

    @abc.abstractmethod
    def step(self, micro_batches: Sequence[MicroBatch]) -> Any:
        """Dispatches one optimizer step; returns what to block on to wait for it."""

    @abc.abstractmethod
    def executables(self) -> dict[str, jax.stages.Compiled]:
        """The compiled executables a step runs (for memory_analysis / cost_analysis)."""

    @abc.abstractmethod
    def opt_state(self) -> Any:
        """The optimizer state after the last step (holds the captured gradient)."""

    @abc.abstractmethod
    def last_loss(self) -> float:
        """The loss the trainer reports for the last optimizer step."""

    def place(self, micro_batches: Sequence[MicroBatch]) -> list[MicroBatch]:
        """Micro-batches transferred into the batch sharding (done before timing); under
        jax.distributed each process contributes its own rows."""
        sharding = batch_sharding(self.mesh)
        return [place_global_batch(mb, sharding) for mb in micro_batches]

    def captured_gradient(self) -> Any:
        """The gradient the optimizer saw in the last step, in our decoder's layout (Tunix's
        Qwen3 gradients are converted), so every arm compares against one reference."""
        grads = captured_gradient(self.opt_state())
        if self.model_kind == "tunix":
            from arms.models.tunix_qwen3 import tunix_to_decoder_params

            return tunix_to_decoder_params(nnx.to_pure_dict(grads)["qwen3"],
                                           self.spec.model_config())
        return nnx.to_pure_dict(grads)

    def kernel_calls_per_step(self) -> dict[str, int]:
        """Calls of each executable per optimizer step (weights FLOPs per step)."""
        return dict.fromkeys(self.executables(), 1)

    def executions_per_step(self) -> int:
        """Executable calls per optimizer step as dispatched by `step` (0 before a step)."""
        return self.calls_per_step

    def close(self) -> None:  # noqa: B027 - optional hook, most arms hold nothing to release
        """Releases the trainer (no-op by default)."""


ArmFactory = Callable[[CellSpec, str], Arm]

NAMED_ARMS: dict[str, tuple[str, str]] = {
    "engine": ("engine", "decoder"),
    "engine-fused": ("engine-fused", "decoder"),
    "native": ("native", "decoder"),
    "peft-decoder": ("peft", "decoder"),
    "peft-tunix": ("peft", "tunix"),
}
"""Arm names -> (trainer, model). Any other pair is spelled TRAINER:MODEL."""


def _trainers() -> dict[str, ArmFactory]:
    from arms.engine_arm import EngineArm, FusedEngineArm
    from arms.native import NativeArm
    from arms.peft import PeftArm

    return {"engine": EngineArm, "engine-fused": FusedEngineArm, "native": NativeArm,
            "peft": PeftArm}


TRAINERS = ("engine", "engine-fused", "native", "peft")


_REGISTERED: dict[str, Callable[[CellSpec], Arm]] = {}


def register(name: str, factory: Callable[[CellSpec], Arm]) -> None:
    """Adds an arm by name (e.g. a test-only arm from a plugin module)."""
    _REGISTERED[name] = factory


def resolve(name: str) -> tuple[str, str]:
    """'peft-tunix' or 'engine:tunix' -> (trainer, model); a clear error lists the valid."""
    if name in _REGISTERED:
        return name, "registered"
    if name in NAMED_ARMS:
        return NAMED_ARMS[name]
    trainer, _, model = name.partition(":")
    if trainer in TRAINERS and model in MODELS:
        return trainer, model
    raise ValueError(
        f"unknown arm {name!r}; valid arms: {', '.join(NAMED_ARMS)}, or any TRAINER:MODEL "
        f"with TRAINER in {{{', '.join(TRAINERS)}}} and MODEL in {{{', '.join(MODELS)}}}")


def make_arm(name: str, spec: CellSpec) -> Arm:
    """An unbuilt arm by name; call `.build()` to compile it."""
    if name in _REGISTERED:
        return _REGISTERED[name](spec)
    trainer, model = resolve(name)
    return _trainers()[trainer](spec, model)
