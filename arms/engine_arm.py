"""The `engine` arms: our TrainingEngine, split protocol (fwd_bwd per micro-batch + update)
or fused (`train_step`: one executable per optimizer step)."""

from __future__ import annotations

import time
from typing import ClassVar

import jax

from arms.abstract import ArmPlan, abstract_batch, bytes_held, bytes_per_device
from arms.base import Arm
from engine import EngineConfig, TrainingEngine
from engine.model import batch_sharding


def _train_state(engine: TrainingEngine) -> dict:
    """The engine's train state by part, as `ArmPlan.state` names them."""
    return {"params": engine.params, "opt_state": engine.opt_state, "rest": engine.rest}


class EngineArm(Arm):
    trainer = "engine"
    fused = False
    HELD: ClassVar[dict[str, tuple[str, ...]]] = {
        "fwd_bwd": ("opt_state",), "fwd_bwd_accumulate": ("opt_state",), "update": ("rest",)}
    """The split protocol's executables -> the train state each leaves outside its
    arguments: between micro-batches and during them the optimizer state waits in memory;
    the update takes the whole train state but the model's non-Param state."""

    def engine_config(self) -> EngineConfig:
        """The engine's configuration for this cell."""
        return EngineConfig(gradient_accumulation_steps=self.spec.ga,
                            gradient_clipping_threshold=self.spec.clip)

    def _engine(self, model) -> TrainingEngine:
        return TrainingEngine(model, self.optimizer(), self.spec.loss_fn(), mesh=self.mesh,
                              rules=self.rules, config=self.engine_config())

    @property
    def _paths(self) -> tuple[str]:
        return ("fused",) if self.fused else ("split",)

    def build(self) -> None:
        self.model = self.build_model()
        self.engine = self._engine(self.model)
        start = time.perf_counter()
        self.engine.compile(self.spec.micro_batches()[0], paths=self._paths)
        self.compile_seconds = time.perf_counter() - start

    def plan(self) -> ArmPlan:
        engine = self._engine(self.build_abstract_model())
        engine.compile(abstract_batch(self.spec, batch_sharding(self.mesh)), paths=self._paths)
        state = _train_state(engine)
        if self.fused:
            return ArmPlan(executables={"train_step": engine.kernels["train_step"].lowered},
                           calls_per_step={"train_step": 1}, state=state)
        calls = {"fwd_bwd": 1, "fwd_bwd_accumulate": self.spec.ga - 1, "update": 1}
        return ArmPlan(
            executables={name: k.lowered for name, k in engine.kernels.items()},
            calls_per_step={name: calls[name] for name in engine.kernels},
            state={**state, "accumulator": engine.abstract_accumulator()},
            held=self._held(engine))

    def step(self, micro_batches):
        before = {name: k.calls for name, k in self.engine.kernels.items()}
        if self.fused:
            self.engine.train_step(micro_batches)
        else:
            with jax.profiler.TraceAnnotation("fwd_bwd"):
                for mb in micro_batches:
                    self.engine.fwd_bwd(mb)
            with jax.profiler.TraceAnnotation("update"):
                self.engine.update()
        self._calls = {name: k.calls - before[name] for name, k in self.engine.kernels.items()}
        self._executions = sum(self._calls.values())
        return self.engine.params

    def calls_per_step(self) -> dict[str, int]:
        return dict(self._calls)

    def place(self, micro_batches):
        return [self.engine.place_batch(mb) for mb in micro_batches]

    def executables(self):
        return {name: k.compiled for name, k in self.engine.kernels.items()}

    def _held(self, engine: TrainingEngine) -> dict[str, tuple[str, ...]]:
        """`HELD` for the split kernels `engine` compiled."""
        return {name: self.HELD[name] for name in engine.kernels}

    def held_bytes(self) -> dict[str, int]:
        if self.fused:
            return {}
        return bytes_held(self._held(self.engine), {
            part: bytes_per_device(tree) for part, tree in _train_state(self.engine).items()})

    def opt_state(self):
        return self.engine.opt_state

    def last_loss(self) -> float:
        return self.engine.get_metrics()[-1].loss

    def trainer_denominator(self) -> float:
        """The engine's step metrics: the sum of its micro-batches' denominators."""
        return self.engine.get_metrics()[-1].denominator

    def close(self) -> None:
        self.engine.close()


class FusedEngineArm(EngineArm):
    trainer = "engine-fused"
    fused = True
