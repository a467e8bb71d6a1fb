"""The `maxtext-engine` arm: MaxText's own `MaxTextTrainingEngine` (the engine ours must beat),
from the installed `maxtext` wheel, driven with its own protocol: `compile(example)`, then
`fwd_bwd(payload)` per micro-batch and `update()` per optimizer step.

What is set from outside, and why:
- the weights: the engine builds its own (randomly initialized) Transformer from the config;
  ours are loaded into it before `compile`, so it starts where every other arm starts;
- the loss and the batches: the shared workload loss, fed through the engine's custom-loss
  hooks (`with_loss_fn`, `with_gen_model_input_fn`) as a Tunix `LossOutput` whose primary
  metric is (loss sum, denominator): the engine accumulates unreduced sums and divides once;
- the optimizer: the engine builds an `nnx.Optimizer` from its config (`opt_type`, schedule,
  MaxText's AdamW defaults). Its documented override point, `_build_optimizer`, receives that
  transform and here returns the cell's optax optimizer instead. So every arm applies the
  same update rule at the same learning rate, and the gradient the parity check reads back
  from that optimizer's state (arms.workload.optimizers) is exactly what the engine hands
  it (after its divide by the summed denominator and its clip);
- side outputs: TensorBoard, checkpoints, profiles and goodput recording are off (no other
  arm writes any), and the run directory is a temp dir removed on close.
"""

from __future__ import annotations

import time
from typing import ClassVar

import jax
import numpy as np
from flax import nnx

from arms.abstract import ArmPlan, abstract_batch, bytes_held, bytes_per_device
from arms.base import Arm
from arms.workload import MicroBatch
from engine.model import batch_sharding


def _payload(mb: MicroBatch) -> dict:
    """A micro-batch as the loss's keyword arguments (the unset GRPO fields left out)."""
    return {k: v for k, v in mb._asdict().items() if v is not None}


def _tunix_loss(loss_fn, abstract_engine):
    """The shared loss as a MaxText/Tunix custom loss: `loss(model, **inputs) -> LossOutput`."""
    from arms.models.maxtext_qwen3 import TransformerCall

    weighted = abstract_engine.WeightedMetric

    def loss(model, tokens, targets, positions, segment_ids, loss_mask, advantages=None,
             old_logprobs=None, ref_logprobs=None):
        out = loss_fn(TransformerCall(model), MicroBatch(
            tokens, targets, positions, segment_ids, loss_mask, advantages, old_logprobs,
            ref_logprobs))
        return abstract_engine.LossOutput(
            primary_loss=weighted(out.loss_sum, out.denominator),
            aux_metrics={name: weighted(value, out.denominator)
                         for name, value in out.aux.items()})

    return loss


class MaxTextEngineArm(Arm):
    trainer = "maxtext-engine"
    HELD: ClassVar[dict[str, tuple[str, ...]]] = {
        "fwd_bwd": ("opt_state",), "fwd_bwd_accum": ("opt_state",)}
    """Its executables -> the train state each leaves outside its arguments: the fwd/bwd
    kernels take the model's state (the optimizer's waits in memory); the update, the
    whole train state."""

    def __init__(self, spec, model: str = "maxtext", **options):
        if model != "maxtext":
            raise ValueError(f"maxtext-engine drives only MaxText's own model, not {model!r}")
        super().__init__(spec, model, **options)

    def _config(self):
        """MaxText's config for the cell: our dimensions, the cell's learning rate and clip
        (no warmup or decay), float32 gradients, nothing written; compiled for the platform
        of the cell's mesh."""
        from arms.models import maxtext_qwen3 as mq

        spec = self.spec
        return mq.maxtext_config(
            spec.model_config(), mesh_shape=dict(self.mesh.shape), seq=spec.seq,
            platform=mq.mesh_platform(self.mesh), learning_rate=spec.learning_rate,
            warmup_steps_fraction=0.0, learning_rate_final_fraction=1.0,
            gradient_clipping_threshold=spec.clip or 0.0, grad_dtype="float32",
            enable_tensorboard=False, init_weights_seed=spec.seed)

    def _hooks(self, engine, abstract_engine) -> None:
        engine.with_loss_fn(_tunix_loss(self.spec.loss_fn(), abstract_engine), has_aux=True)
        engine.with_gen_model_input_fn(_payload)

    def build(self) -> None:
        from arms.models import maxtext_qwen3 as mq

        abstract_engine, maxtext_engine = mq.require_maxtext(engine=True)
        spec = self.spec
        config = spec.model_config()
        tx = self.optimizer()
        mx_config = self._config()
        mesh = mq.maxtext_mesh(self.mesh, mx_config)

        class Engine(maxtext_engine.MaxTextTrainingEngine):
            def _build_optimizer(self, maxtext_tx):
                del maxtext_tx  # the cell's optimizer replaces the config-built one
                return nnx.Optimizer(self._model, tx, wrt=nnx.Param)

        self.engine = Engine(mx_config, mesh=mesh)
        mq.check_shardable(self.engine.model, mesh, mx_config)  # the batch: spec.make_mesh
        decoder = self._reference_weights()
        mq.write_params(self.engine.model, mq.decoder_to_maxtext_params(
            nnx.to_pure_dict(nnx.state(decoder, nnx.Param)), config))
        self._hooks(self.engine, abstract_engine)
        self.mesh, self.rules = mesh, mq.rules(mx_config)
        example = self.place(spec.micro_batches())[0]
        start = time.perf_counter()  # compile only, as for the other arms (build_s has it all)
        self.engine.compile(example)
        self.compile_seconds = time.perf_counter() - start
        self._metrics = None

    def plan(self) -> ArmPlan:
        """MaxText's engine planned the way MaxText plans it: its own ahead-of-time engine
        (`AbstractMaxTextEngine`, whose weights and moments are shapes) with the cell's
        optimizer, loss and micro-batch. `compile_kernels` is (maxtext 0.2.5) its
        `_lower_kernels`, then each kernel's `compile` with `_xla_options(None)` (the
        config's compile flags); the planner takes those two halves, so that it compiles the
        kernels itself. The accumulating kernel is lowered at GA 1 too (0 calls there)."""
        from arms.models import maxtext_qwen3 as mq

        abstract_engine, _ = mq.require_maxtext(engine=True)
        from maxtext.training_engine.maxtext_engine_compile import AbstractMaxTextEngine

        tx = self.optimizer()
        mx_config = self._config()
        mesh = mq.maxtext_mesh(self.mesh, mx_config)

        class Engine(AbstractMaxTextEngine):
            def _build_optimizer(self, maxtext_tx):
                del maxtext_tx  # the cell's optimizer replaces the config-built one
                return super()._build_optimizer(tx)

        engine = Engine(mx_config, mesh)
        mq.check_shardable(engine.model, mesh, mx_config)
        self._hooks(engine, abstract_engine)
        self.mesh, self.rules = mesh, mq.rules(mx_config)
        example = abstract_batch(self.spec, batch_sharding(mesh))
        lowered = engine._lower_kernels(example)
        grads = lowered["fwd_bwd"].out_info[3]  # the accumulated sums fwd_bwd hands on
        return ArmPlan(
            executables=lowered, calls_per_step=self.calls_per_step(),
            compiler_options=engine._xla_options(None),
            state={"params": nnx.state(engine.model, nnx.Param),
                   "opt_state": nnx.state(engine.optimizer),
                   "rest": nnx.state(engine.model, nnx.Not(nnx.Param)), "accumulator": grads},
            held=self.HELD)

    def _reference_weights(self):
        from engine.model import build_decoder

        return build_decoder(self.spec.model_config(), seed=self.spec.seed)

    def step(self, micro_batches):
        with jax.profiler.TraceAnnotation("fwd_bwd"):
            for mb in micro_batches:
                self.engine.fwd_bwd(mb)
        with jax.profiler.TraceAnnotation("update"):
            self.engine.update()
        # One buffer per update, read as a user of the engine would; its gradient norm comes
        # out of the update executable, so it is ready once the step has landed.
        self._metrics = self.engine.get_metrics()
        self._executions = len(micro_batches) + 1
        return self._metrics.scalar_metrics["gradient_norm"]

    def executables(self):
        e = self.engine
        return {"fwd_bwd": e._compiled_fwd_bwd, "fwd_bwd_accum": e._compiled_fwd_bwd_accum,
                "update": e._compiled_update}

    def calls_per_step(self) -> dict[str, int]:
        return {"fwd_bwd": 1, "fwd_bwd_accum": self.spec.ga - 1, "update": 1}

    def held_bytes(self) -> dict[str, int]:
        optimizer = bytes_per_device(nnx.state(self.engine.optimizer))
        return bytes_held(self.HELD, {"opt_state": optimizer})

    def opt_state(self):
        return self.engine.optimizer.opt_state

    def decoder_layout(self, grads: dict) -> dict:
        """MaxText's engine optimizes the Transformer itself: its gradient's top level is
        the Transformer's (no `transformer` key, as MaxText's model as an arm has)."""
        from arms.models.maxtext_qwen3 import maxtext_to_decoder_params

        return maxtext_to_decoder_params(grads, self.spec.model_config())

    def last_loss(self) -> float:
        """The step loss as MaxText's MetricsLogger reports it: the step buffer holds one
        (sum, denominator) per micro-batch, `compute()` divides each, and the logger takes
        their mean, i.e. a mean of micro-batch means (the gradient itself is sum/sum)."""
        return float(np.mean(np.asarray(self._metrics.weighted_metrics["loss"].compute())))

    def trainer_denominator(self) -> float:
        """The weights of the step's loss metric in MaxText's metrics buffer (one per
        micro-batch): the denominator its update divides the summed gradient by."""
        return float(np.sum(np.asarray(self._metrics.weighted_metrics["loss"].denominator)))

    def close(self) -> None:
        self.engine.close()
