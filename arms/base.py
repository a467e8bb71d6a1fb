"""The Arm protocol and the model builders every arm shares (the registry of arms is
`arms.registry`)."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import jax
import optax
from flax import nnx

from arms.kinds import MODELS, describe
from arms.spec import CellSpec
from arms.workload import MicroBatch
from arms.workload.optimizers import first_gradient, gradient_state
from engine.model import LOGICAL_AXIS_RULES, batch_sharding, build_decoder
from engine.model.sharding import LogicalRules, place_global_batch

if TYPE_CHECKING:
    from arms.abstract import ArmPlan


def build_model(kind: str, spec: CellSpec, mesh) -> nnx.Module:
    """The model of one arm, on `mesh`; every kind starts from the same (seeded) weights.

    A maxtext model carries its own layout (`mx_mesh`: `mesh`'s devices under MaxText's axis
    names, and MaxText's logical axis rules); see `model_layout`.
    """
    if kind not in MODELS:
        raise ValueError(f"unknown model {kind!r}; valid models: {', '.join(MODELS)}")
    decoder = build_decoder(spec.model_config(), seed=spec.seed, mesh=mesh)
    if kind == "decoder":
        return decoder
    if kind == "maxtext":  # maxtext (Python 3.12) is imported only by arms that use it
        from arms.models.maxtext_qwen3 import to_maxtext

        return to_maxtext(decoder, mesh, seq=spec.seq)
    from arms.models.tunix_qwen3 import to_tunix  # tunix is imported only by arms that use it

    return to_tunix(decoder, mesh=mesh)


def model_layout(model: nnx.Module, mesh) -> tuple[Any, LogicalRules]:
    """(mesh, logical axis rules) an arm runs `model` under: MaxText's own for its model,
    else this project's mesh and rules (Tunix's Qwen3 names mesh axes, which resolve to
    themselves under them)."""
    from arms.models.maxtext_qwen3 import MaxTextDecoder, rules

    if isinstance(model, MaxTextDecoder):
        return model.mx_mesh, rules(model.mx_config)
    return mesh, LOGICAL_AXIS_RULES


def check_model(kind: str, spec: CellSpec) -> None:
    """Refuses, before anything is built, a cell the model kind cannot express (neither
    MaxText nor Tunix is imported for it)."""
    if kind == "maxtext":
        from arms.models.maxtext_qwen3 import check_expressible

        check_expressible(spec.model_config())
    elif kind == "tunix":
        from arms.models.tunix_qwen3 import check_expressible

        check_expressible(spec.model_config())


class Arm(abc.ABC):
    """One trainer driving one model over the shared workload of a `CellSpec`."""

    trainer: str = ""
    """Registry name of the trainer (arms.kinds.TRAINERS), or of a plugin arm."""

    def __init__(self, spec: CellSpec, model: str = "decoder", *,
                 devices: Sequence[jax.Device] | None = None):
        """`devices`: what the mesh is laid over (default: this process's)."""
        if model not in MODELS:
            raise ValueError(f"unknown model {model!r}; valid models: {', '.join(MODELS)}")
        self.spec, self.model_kind = spec, model
        # Refuses a mesh the model cannot use, before compiling.
        self.mesh = spec.make_mesh(devices)
        self.rules: LogicalRules = LOGICAL_AXIS_RULES
        check_model(model, spec)
        self.compile_seconds = 0.0
        self._executions = 0  # executable calls the last step() dispatched

    def build_model(self) -> nnx.Module:
        """Builds this arm's model and adopts the mesh and rules it runs under."""
        model = build_model(self.model_kind, self.spec, self.mesh)
        self.mesh, self.rules = model_layout(model, self.mesh)
        return model

    def build_abstract_model(self) -> nnx.Module:
        """This arm's model as shapes on its mesh (nothing allocated), adopting the mesh and
        rules it runs under, as `build_model` does."""
        from arms.abstract import abstract_model

        model = abstract_model(self.model_kind, self.spec, self.mesh)
        self.mesh, self.rules = model_layout(model, self.mesh)
        return model

    def optimizer(self) -> optax.GradientTransformation:
        """The cell's optimizer, as the trainer is given it: nothing is chained in front
        of it (the parity check reads the first step's gradient from its own state:
        arms.workload.optimizers)."""
        return self.spec.optimizer_tx()

    def plan(self) -> ArmPlan:
        """This arm's step compiled for its mesh from shapes alone (`arms.abstract`); its
        devices may be a TPU topology's compile-only ones."""
        raise NotImplementedError(f"arm {self.trainer!r} cannot be planned without "
                                  "materializing its model (it has no abstract build)")

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
        """The optimizer state after the last step (after the first, it holds the
        gradient its update saw: `gradient_state`)."""

    @abc.abstractmethod
    def last_loss(self) -> float:
        """The loss the trainer reports for the last optimizer step."""

    def place(self, micro_batches: Sequence[MicroBatch]) -> list[MicroBatch]:
        """Micro-batches transferred into the batch sharding (done before timing); under
        jax.distributed each process contributes its own rows."""
        sharding = batch_sharding(self.mesh)
        return [place_global_batch(mb, sharding) for mb in micro_batches]

    def seen_gradient(self, gather=jax.device_get) -> dict:
        """The gradient this arm's optimizer saw in the one step it has taken, read back
        from the optimizer's own state (arms.workload.optimizers.gradient_state: nothing is
        chained into the trainer's program for it), in our decoder's layout: gathered to the
        host as the state holds it (`gather`: every process's shards, where the cell spans
        several), unscaled there and converted there (`decoder_layout`), so the devices hold
        nothing more than the trainer's own state."""
        tree, factor = gradient_state(self.opt_state())
        tree = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
        return self.decoder_layout(first_gradient(gather(tree), factor))

    def decoder_layout(self, grads: dict) -> dict:
        """A host gradient (pure dict of numpy arrays) of this arm's model in our decoder's
        layout (Tunix's and MaxText's Qwen3 gradients are converted, on the host), so every
        arm compares against one reference."""
        if self.model_kind == "maxtext":
            from arms.models.maxtext_qwen3 import maxtext_to_decoder_params

            return maxtext_to_decoder_params(grads["transformer"], self.spec.model_config())
        if self.model_kind == "tunix":
            from arms.models.tunix_qwen3 import tunix_to_decoder_params

            return tunix_to_decoder_params(grads["qwen3"], self.spec.model_config())
        return grads

    def calls_per_step(self) -> dict[str, int]:
        """Calls of each executable per optimizer step (weights FLOPs per step)."""
        return dict.fromkeys(self.executables(), 1)

    def held_bytes(self) -> dict[str, int]:
        """Executable -> bytes per device of the train state that stays in device memory
        while it runs without being one of its arguments (the optimizer moments during a
        split fwd/bwd: the parts its `ArmPlan.held` names), read off the live arrays. Empty
        for a step that takes the whole train state (the default)."""
        return {}

    def about(self) -> str:
        """'<trainer> on <model>' in words, for the record and the report."""
        return describe(self.trainer, self.model_kind)

    def trainer_denominator(self) -> float | None:
        """What the trainer divided the last step's accumulated gradient by, as the trainer
        itself reports or configures it; None where it says nothing (the default)."""
        return None

    def executions_per_step(self) -> int:
        """Executable calls per optimizer step as dispatched by `step` (0 before a step)."""
        return self._executions

    def close(self) -> None:  # noqa: B027 - optional hook, most arms hold nothing to release
        """Releases the trainer (no-op by default)."""
