"""The PeftTrainer arms: google-tunix's real `PeftTrainer`, driven one micro-batch at a time
with the executable its own `train()` uses (`jit_train_and_eval_step(cache_nnx_graph=True)`).

What Tunix does is kept as it is, since it is what is measured: gradient accumulation is
`optax.MultiSteps` (the mean of per-micro-batch means, and the inner optimizer runs every
micro-step), each micro-step computes a gradient norm, and the loss it optimizes is the
micro-batch mean `loss_sum / denominator`. Its loop's input sharding (`shard_input`) and
inflight throttling are replayed per micro-batch; its metrics logging is not.

Tunix's v1 trainer sees a mesh only through the legacy `with mesh:`; the model is placed on
the mesh before the trainer is built (else step 2 recompiles), and the steps run under that
mesh, `jax.set_mesh` and the logical-axis rules (so our decoder's activation constraints
apply as they do in the other arms).
"""

from __future__ import annotations

import contextlib
import importlib
import time

import jax
from flax import nnx
from flax.core import spmd as core_spmd

from arms.abstract import ArmPlan, abstract_batch, traced_state
from arms.base import Arm
from arms.workload import MicroBatch
from engine.model import batch_sharding

DATA_AXES = (("data", "fsdp"),)
"""Tunix's `data_sharding_axis`, which it spreads into a PartitionSpec (one entry per array
dimension): the batch dimension over `data` and `fsdp` together, as every arm's batch
(`engine.model.batch_sharding`). Spelled ("data", "fsdp"), it would shard the batch over
`data` and the sequence over `fsdp`."""


def peft_trainer_module():
    """Tunix's v2 trainer if this install provides it, else `tunix.sft.peft_trainer`."""
    for name in ("tunix.experimental.train.peft_trainer_v2", "tunix.sft.peft_trainer"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise ImportError("google-tunix is not installed; `pip install google-tunix==0.1.7`")


def _mean_loss(loss_fn):
    """The shared loss in Tunix's `loss_fn(model, **inputs)` convention, per-batch mean."""

    # Named parameters: nnx.value_and_grad resolves Tunix's `**inputs` call to positions.
    def tunix_loss(model, tokens, targets, positions, segment_ids, loss_mask, advantages=None,
                   old_logprobs=None, ref_logprobs=None):
        out = loss_fn(model, MicroBatch(tokens, targets, positions, segment_ids, loss_mask,
                                        advantages, old_logprobs, ref_logprobs))
        return out.loss_sum / out.denominator, {"loss_sum": out.loss_sum,
                                                "denominator": out.denominator}

    return tunix_loss


def _jitted_step(cached_step):
    """The nnx.jit function under Tunix's cached train step: `jit_train_and_eval_step` wraps
    it as functools.partial(nnx.cached_partial(jitted, model, optimizer)), and the cached
    partial keeps it as `__wrapped__`."""
    jitted = getattr(getattr(cached_step, "func", None), "__wrapped__", None)
    if not hasattr(jitted, "lower"):
        raise TypeError(f"this google-tunix's cached train step ({cached_step!r}) does not wrap "
                        "an nnx.jit function where 0.1.7 does; the PeftTrainer arm needs "
                        "updating for it")
    return jitted


class PeftArm(Arm):
    trainer = "peft"

    @contextlib.contextmanager
    def _context(self):
        with self.mesh, jax.set_mesh(self.mesh), core_spmd.logical_axis_rules(self.rules):
            yield

    def _trainer(self, model):
        """Tunix's PeftTrainer on `model` with the cell's optimizer (and clip, in front)."""
        module = peft_trainer_module()
        self.trainer_module = module.__name__
        spec = self.spec
        config = module.TrainingConfig(
            eval_every_n_steps=1 << 30,
            gradient_accumulation_steps=spec.ga if spec.ga > 1 else None,
            data_sharding_axis=DATA_AXES)
        tx = self.optimizer()
        if spec.clip is not None:
            import optax

            tx = optax.chain(optax.clip_by_global_norm(spec.clip), tx)
        return module.PeftTrainer(model, tx, config)

    def build(self) -> None:
        spec = self.spec
        self.model = self.build_model()
        with self._context():
            self.peft = self._trainer(self.model)
            self.peft.with_loss_fn(_mean_loss(spec.loss_fn()), has_aux=True)
            self.train_step, _ = self.peft.jit_train_and_eval_step(cache_nnx_graph=True)
            from tunix.sft import sharding_utils

            example = sharding_utils.shard_input(self.place(spec.micro_batches())[0]._asdict(),
                                                 DATA_AXES)
            start = time.perf_counter()
            # Tunix's own nnx.jit of its train step, under its cached partial: lowered and
            # compiled here with the arguments the partial passes it, so the steps run this
            # very trace and executable (no second trace or compile in the first step) and
            # memory/cost analysis reads the program that runs.
            self._compiled = _jitted_step(self.train_step).lower(
                self.model, self.peft.optimizer, example).compile()
            self.compile_seconds = time.perf_counter() - start
        self._losses: list = []

    def plan(self) -> ArmPlan:
        """Tunix's own jitted train step, on a model and optimizer of shapes.

        PeftTrainer builds its `nnx.Optimizer` eagerly (`tx.init` on the weights), so it is
        built inside a trace (`arms.abstract.traced_state`), which gives each optimizer
        leaf the layout the eager init gives it (its parameter's), and then handed the
        abstract model and optimizer; its jitted step is lowered with them as in `build`.
        """
        spec = self.spec
        model = self.build_abstract_model()
        graph, state = nnx.split(model)
        made = {}

        def build(state):
            trainer = self._trainer(nnx.merge(graph, state))
            made["trainer"], (made["graph"], opt_state) = trainer, nnx.split(trainer.optimizer)
            return opt_state

        opt_state = traced_state(build, state, self.mesh)
        trainer = made["trainer"]
        trainer.model, trainer.optimizer = model, nnx.merge(made["graph"], opt_state)
        trainer.with_loss_fn(_mean_loss(spec.loss_fn()), has_aux=True)
        # Outside the mesh: under it, its optimizer-sharding pass would constrain the shapes
        # (they carry the layout that pass gives the arrays in `build`).
        train_step, _ = trainer.jit_train_and_eval_step(cache_nnx_graph=True)
        example = abstract_batch(spec, batch_sharding(self.mesh))._asdict()
        with self._context():
            lowered = _jitted_step(train_step).lower(model, trainer.optimizer, example)
        return ArmPlan(executables={"train_step": lowered},
                       calls_per_step={"train_step": spec.ga},
                       state={"params": nnx.state(model, nnx.Param), "opt_state": opt_state,
                              "rest": nnx.state(model, nnx.Not(nnx.Param))})

    def step(self, micro_batches):
        from tunix.sft import sharding_utils

        throttler = self.peft._throttler
        self._losses = []
        with self._context():
            for mb in micro_batches:
                inputs = sharding_utils.shard_input(mb._asdict(), DATA_AXES)
                throttler.wait_for_next()
                loss, _aux, _grad_norm = self.train_step(inputs)
                throttler.add_computation(loss)
                self._losses.append(loss)
        self._executions = len(micro_batches)
        return self._losses

    def executables(self):
        return {"train_step": self._compiled}

    def calls_per_step(self) -> dict[str, int]:
        return {"train_step": self.spec.ga}

    def opt_state(self):
        return self.peft.optimizer.opt_state

    def last_loss(self) -> float:
        """Tunix's reported step loss: the mean of the micro-batch mean losses."""
        return float(sum(float(x) for x in self._losses) / len(self._losses))

    def trainer_denominator(self) -> float:
        """PeftTrainer's configured accumulation (`gradient_accumulation_steps`, else 1):
        optax.MultiSteps averages that many micro-batch mean gradients, each counting 1."""
        return float(self.peft.config.gradient_accumulation_steps or 1)

    def close(self) -> None:
        self.peft._throttler.wait_for_all()
