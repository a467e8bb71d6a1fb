"""The optimized training engine and its MaxText-style model. Imports jax/flax/optax/orbax only."""

from engine.config import EngineConfig
from engine.kernels import Accumulator, MicroBatchMetrics
from engine.metrics import StepMetrics
from engine.trainer import Kernel, TrainingEngine

__all__ = ["Accumulator", "EngineConfig", "Kernel", "MicroBatchMetrics", "StepMetrics",
           "TrainingEngine"]
