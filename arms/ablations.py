"""The `engine` arm with one optimization switched off, to measure what each is worth against
`engine` (`parity run --plugin arms.ablations --arms engine,engine-no-state-cache`).

Each is the same TrainingEngine and the same work (the same gradient, to the bit); one
behaviour is changed, of the host's side on the built engine instance (the way a user's code
could defeat it) or of the engine's configuration:

- `engine-no-state-cache`: the pure-state cache off. Before every step the engine splits the
  NNX model graph again (`nnx.split`) and copies the state into place: the path it takes
  anyway once `engine.model` is changed from outside (DESIGN item 7).
- `engine-eager-metrics`: each step's metrics read to the host as soon as the step is
  dispatched, which waits for the step, instead of after the next step's dispatch (item 9).
- `engine-unbounded-metrics`: the metrics history keeps every step (item 6); over a timed
  window of a few dozen steps it holds as few as the default window does, so it shows only
  in long runs.
- `engine-cast-per-micro-batch`: at GA > 1 every accumulating fwd/bwd casts the weights
  again instead of reading the copies the step's first one made (item 16,
  `EngineConfig.cast_once_per_step=False`): other programs, the same bits.

Beside them, a candidate: one change the engine does not make by default, to A/B before it
does:

- `engine-copies-float32-gradient`: at GA > 1, the accumulating fwd/bwd reads the step's
  copies but differentiates the float32 parameters through them
  (`EngineConfig.copies_float32_gradient`): each layer's weight gradient is stored in
  float32, not bfloat16, inside the backward's layer loop. The same bits on the CPU.

The two optimizations of the seed that are properties of the compiled kernels (no dead
computation, item 8; a scalar throttler marker, item 5) cannot be switched off on an
instance: their tests (tests/engine/test_optimizations.py) count the kernels' outputs and the
marker's shape instead.
"""

from __future__ import annotations

import dataclasses

from arms.engine_arm import EngineArm
from arms.registry import register

UNBOUNDED = 2**62
"""A metrics window no run reaches."""


class NoStateCache(EngineArm):
    trainer = "engine-no-state-cache"

    def build(self) -> None:
        super().build()
        self.engine._cache_enabled = False  # re-split and re-place the model every step


class EagerMetrics(EngineArm):
    trainer = "engine-eager-metrics"

    def step(self, micro_batches):
        out = super().step(micro_batches)
        self.engine.recorder.publish_pending()  # reads this step's metrics now: waits for it
        return out


class UnboundedMetrics(EngineArm):
    trainer = "engine-unbounded-metrics"

    def engine_config(self):
        return dataclasses.replace(super().engine_config(), metrics_window=UNBOUNDED)


class CastPerMicroBatch(EngineArm):
    trainer = "engine-cast-per-micro-batch"

    def engine_config(self):
        return dataclasses.replace(super().engine_config(), cast_once_per_step=False)


class CopiesFloat32Gradient(EngineArm):
    trainer = "engine-copies-float32-gradient"

    def engine_config(self):
        return dataclasses.replace(super().engine_config(), copies_float32_gradient=True)


ABLATIONS = {cls.trainer: cls for cls in (NoStateCache, EagerMetrics, UnboundedMetrics,
                                          CastPerMicroBatch)}
"""Arm name -> its class."""
CANDIDATES = {cls.trainer: cls for cls in (CopiesFloat32Gradient,)}
"""Arm name -> its class: changes not (yet) the engine's default."""

for _name, _cls in {**ABLATIONS, **CANDIDATES}.items():
    register(_name, lambda spec, _cls=_cls, **options: _cls(spec, "decoder", **options))
