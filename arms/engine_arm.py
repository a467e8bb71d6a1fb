"""The `engine` arms: our TrainingEngine, split protocol (fwd_bwd per micro-batch + update)
or fused (`train_step`: one executable per optimizer step)."""

from __future__ import annotations

import time

import jax

from arms.base import Arm
from arms.capture import with_capture
from engine import EngineConfig, TrainingEngine


class EngineArm(Arm):
    trainer = "engine"
    fused = False

    def build(self) -> None:
        spec = self.spec
        self.model = self.build_model()
        self.engine = TrainingEngine(
            self.model, with_capture(spec.optimizer_tx()), spec.loss_fn(), mesh=self.mesh,
            rules=self.rules,
            config=EngineConfig(gradient_accumulation_steps=spec.ga,
                                gradient_clipping_threshold=spec.clip))
        start = time.perf_counter()
        self.engine.compile(spec.micro_batches()[0], paths=("fused",) if self.fused
                            else ("split",))
        self.compile_seconds = time.perf_counter() - start

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

    def opt_state(self):
        return self.engine.opt_state

    def last_loss(self) -> float:
        return self.engine.get_metrics()[-1].loss

    def close(self) -> None:
        self.engine.close()


class FusedEngineArm(EngineArm):
    trainer = "engine-fused"
    fused = True
