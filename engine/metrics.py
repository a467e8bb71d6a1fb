"""Host-side metrics recording and the inflight throttler.

The recorder never touches the device per micro-batch: it appends the kernels' output
scalars to Python lists. At the end of a step the lists become the *pending* step; the
engine publishes it only after its next dispatch, so the one device->host read (a single
`jax.device_get` over the whole step) waits on work that finished while newer work is
already queued. On the host each metric is stacked once per step.
"""

from __future__ import annotations

import collections
import dataclasses
import warnings

import jax
import numpy as np

from engine.kernels import MicroBatchMetrics


@dataclasses.dataclass(frozen=True)
class StepMetrics:
    """One optimizer step, read back to the host."""

    step: int
    """1-based index of the optimizer step (counting skipped steps)."""
    loss: float
    """sum(loss sums) / sum(denominators): the loss the update optimized."""
    denominator: float
    """sum of the micro-batches' denominators."""
    micro_batch_loss_sums: np.ndarray
    """[GA] unnormalized loss sum of each micro-batch."""
    micro_batch_denominators: np.ndarray
    """[GA] denominator of each micro-batch."""
    aux: dict[str, float]
    """Each aux sum divided by `denominator`, keyed without its "_sum" suffix."""
    applied: bool
    """False if the step loss was not finite and the update was skipped."""


def _check_scalar(name: str, value) -> None:
    if not isinstance(value, jax.Array | np.ndarray | np.generic):
        raise TypeError(f"metric {name!r} has unsupported type {type(value).__name__}; metrics "
                        "must be scalar jax/numpy arrays")
    if value.shape != () or not np.issubdtype(value.dtype, np.number):
        raise TypeError(f"metric {name!r} must be a numeric scalar, got shape {value.shape} "
                        f"dtype {value.dtype}")


def validate(metrics: MicroBatchMetrics) -> None:
    """Raises TypeError (naming the metric) unless every value is a numeric scalar.

    Works on concrete arrays and on `jax.ShapeDtypeStruct`s, so the engine refuses a loss
    with unsupported aux values at compile time, before any step is applied.
    """
    named = {"loss_sum": metrics.loss_sum, "denominator": metrics.denominator}
    if not isinstance(metrics.aux, dict):
        raise TypeError(f"aux must be a dict of scalar metrics, got {type(metrics.aux).__name__}")
    named.update({f"aux.{k}": v for k, v in metrics.aux.items()})
    for name, value in named.items():
        if isinstance(value, jax.ShapeDtypeStruct):
            value = np.zeros(value.shape, value.dtype)
        _check_scalar(name, value)


class MetricsRecorder:
    """Buffers micro-batch metrics, publishes whole steps all-or-nothing, keeps a window."""

    def __init__(self, window: int, nan_policy: str):
        self.window = window
        self.nan_policy = nan_policy
        self.history: collections.deque[StepMetrics] = collections.deque(maxlen=window)
        self.evicted = 0
        self._buffer: list[MicroBatchMetrics] = []
        self._pending: list[tuple[int, object, object]] = []  # (step, metrics, finite flag)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def add(self, metrics: MicroBatchMetrics) -> None:
        """Per micro-batch: validate on arrival and append; no device op, no transfer."""
        validate(metrics)
        self._buffer.append(metrics)

    def end_step(self, step: int, finite) -> None:
        """The buffered micro-batches form step `step`; published after the next dispatch."""
        self._pending.append((step, tuple(self._buffer), finite))
        self._buffer = []

    def add_stacked(self, step: int, metrics: MicroBatchMetrics, finite) -> None:
        """A fused step's metrics, already stacked [GA] by the kernel."""
        self._pending.append((step, metrics, finite))

    def publish_pending(self) -> None:
        """Reads every pending step to the host and appends them to the history.

        All-or-nothing: everything is read and checked before the history changes, so a
        failure leaves the history exactly as it was.
        """
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        host = jax.device_get([(m, f) for _, m, f in pending])  # one transfer for all
        records = [self._to_record(step, metrics, bool(finite))
                   for (step, _, _), (metrics, finite) in zip(pending, host, strict=True)]
        for record in records:
            if len(self.history) == self.window:
                if self.evicted % self.window == 0:
                    warnings.warn(
                        f"metrics history is full ({self.window} steps): evicting the oldest "
                        f"steps; read get_metrics() at least every {self.window} steps or raise "
                        "EngineConfig.metrics_window", RuntimeWarning, stacklevel=3)
                self.evicted += 1
            self.history.append(record)
        for record in records:
            if not record.applied and self.nan_policy == "raise":
                bad = [i for i, s in enumerate(record.micro_batch_loss_sums)
                       if not np.isfinite(s)]
                raise FloatingPointError(
                    f"non-finite loss at step {record.step}, micro-batch {bad[0] if bad else '?'} "
                    f"(of {len(record.micro_batch_loss_sums)}); the update was not applied and "
                    "the weights are unchanged. Use EngineConfig(nan_policy='skip') to skip "
                    "such steps instead")

    @staticmethod
    def _to_record(step: int, metrics, applied: bool) -> StepMetrics:
        if isinstance(metrics, tuple) and not isinstance(metrics, MicroBatchMetrics):
            # Stacked once per metric per step, on the host.
            loss_sums = np.stack([m.loss_sum for m in metrics])
            dens = np.stack([m.denominator for m in metrics])
            aux = {k: np.stack([m.aux[k] for m in metrics]) for k in metrics[0].aux}
        else:
            loss_sums, dens, aux = metrics.loss_sum, metrics.denominator, metrics.aux
        loss_sums, dens = np.asarray(loss_sums, np.float64), np.asarray(dens, np.float64)
        denominator = float(dens.sum())
        scale = 1.0 / denominator if denominator > 0 else 0.0
        return StepMetrics(
            step=step, loss=float(loss_sums.sum()) * scale, denominator=denominator,
            micro_batch_loss_sums=loss_sums, micro_batch_denominators=dens,
            aux={k.removesuffix("_sum"): float(np.asarray(v, np.float64).sum()) * scale
                 for k, v in aux.items()},
            applied=applied)


class InflightThrottler:
    """Bounds the optimizer steps in flight by blocking on the oldest step's scalar marker.

    It holds only the scalar step counter each update executable produces, never a
    parameter tree: holding params would keep every in-flight step's weights alive.
    """

    def __init__(self, max_inflight: int):
        self.max_inflight = max_inflight
        self.markers: collections.deque[jax.Array] = collections.deque()

    def push(self, marker: jax.Array) -> None:
        if marker.shape != ():
            raise TypeError(f"throttle markers must be scalars, got shape {marker.shape}")
        self.markers.append(marker)
        while len(self.markers) > self.max_inflight:
            self.markers.popleft().block_until_ready()

    def drain(self) -> None:
        while self.markers:
            self.markers.popleft().block_until_ready()
