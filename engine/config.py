"""EngineConfig: the knobs of the training engine."""

from __future__ import annotations

import dataclasses
from typing import Literal


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """How the engine steps, normalizes, guards and records."""

    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step; `update()` refuses to run after any other count."""
    grad_dtype: str | None = None
    """dtype the optimizer sees the gradient in (e.g. "bfloat16"); None keeps the param dtype.
    Accumulation is always float32; the cast happens after the 1/sum(denominators) scale."""
    gradient_clipping_threshold: float | None = None
    """Global-norm clip (optax.clip_by_global_norm) applied to the normalized gradient."""
    max_inflight: int = 2
    """Optimizer steps allowed in flight before the host blocks on the oldest one's marker."""
    metrics_window: int = 128
    """Steps of metrics history kept; older steps are evicted (with one warning per window)."""
    nan_policy: Literal["raise", "skip"] = "raise"
    """Non-finite step loss: the update is never applied; "raise" also raises an error naming
    the step and micro-batch when the metrics are read, "skip" just counts the skipped step."""
    cast_once_per_step: bool = True
    """At gradient_accumulation_steps > 1, the split path's first fwd_bwd also returns the
    compute-dtype copies of the parameters the model reads only in that dtype (their
    `compute_dtype` metadata, `engine.model.precast`), and the accumulating fwd_bwd reads
    those copies instead of casting every such parameter again for each micro-batch. The
    same loss and gradient to the bit; the copies live from the first micro-batch to the
    update. False: every micro-batch casts (as a model without that metadata does)."""
    copies_float32_gradient: bool = False
    """With `cast_once_per_step`, the accumulating fwd_bwd differentiates the float32
    parameters through their copies (`engine.model.precast.read_copy`) rather than the
    copies themselves, so each layer's weight gradient is stored in float32 inside the
    backward's layer loop, as in a program that casts per micro-batch, not in the copies'
    bfloat16 before the accumulator's float32 add. The same values forward; where the
    backend rounds a matmul's result to its bfloat16 type before the store (the CPU) the
    same gradient to the bit, where it keeps a fused float32 result (a TPU) a nearer one.
    A candidate for the chip's A/B (docs/tpu-v5e.md)."""
    shape_policy: Literal["refuse", "recompile"] = "refuse"
    """A micro-batch whose shapes differ from the compiled ones: "refuse" raises a clear error;
    "recompile" recompiles every kernel for the new shapes with one warning."""

    def __post_init__(self):
        if self.gradient_accumulation_steps < 1:
            raise ValueError("gradient_accumulation_steps must be >= 1, got "
                             f"{self.gradient_accumulation_steps}")
        if self.max_inflight < 1:
            raise ValueError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.metrics_window < 1:
            raise ValueError(f"metrics_window must be >= 1, got {self.metrics_window}")
        if self.nan_policy not in ("raise", "skip"):
            raise ValueError(f"nan_policy={self.nan_policy!r}; valid: 'raise', 'skip'")
        if self.shape_policy not in ("refuse", "recompile"):
            raise ValueError(f"shape_policy={self.shape_policy!r}; valid: 'refuse', 'recompile'")
        if self.grad_dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"grad_dtype={self.grad_dtype!r}; valid: None, 'float32', "
                             "'bfloat16', 'float16'")
        if self.gradient_clipping_threshold is not None and self.gradient_clipping_threshold <= 0:
            raise ValueError("gradient_clipping_threshold must be > 0 or None")
