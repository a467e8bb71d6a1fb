"""TrainingEngine: owns jit, shardings, donation, the pure-state cache, throttling, metrics.

The math lives in `engine.kernels`; this class decides *how* it runs:
- every kernel is a fresh closure, lowered and compiled ahead of time inside the mesh and the
  logical-axis rules (JAX's trace cache ignores flax's thread-local rules), with explicit
  in/out shardings (gradients come back sharded like the params), and called inside them;
- donation: the accumulating fwd/bwd donates the accumulator (its sums are updated in place);
  `update` and `train_step` donate the params and optimizer state they replace, so XLA
  writes the new state into the old buffers instead of allocating a second copy, and the new
  params are republished to `engine.model` right after the call. `update` also takes the
  accumulator, whose gradient sums no output of the update can be aliased to (its
  parameter-sized outputs are the new params and moments, aliased to the old), so JAX drops
  their donation and they stay allocated until the update ends. That never sets the split
  engine's peak: the update holds params + optimizer state + accumulator, which every fwd/bwd
  also holds (the optimizer state beside it) on top of its activations. The fwd/bwd kernels
  never donate params: `engine.model` must stay usable between micro-batches, and a donated
  buffer may be aliased to any output of its shape, which the gradients all have. The step
  counter is not donated: it is the throttler's marker for that step;
- the model graph is split once per compile; afterwards kernel outputs are republished to
  `engine.model` with `nnx.update` instead of re-splitting the graph every step;
- at GA > 1 the first fwd_bwd of a step also returns the compute-dtype copies of the
  parameters the model reads only cast (`engine.model.precast`), and the accumulating
  fwd_bwd reads them: one cast per step, as a single program over every micro-batch has.

An engine built on an abstract model (shapes with shardings, e.g. `abstract_decoder` on a TPU
topology's compile-only devices) lowers every kernel without allocating anything; compiled
(`Kernel.compiled`, on first use), they are XLA's plan for that mesh, to inspect, never to
run.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from engine import checkpoint, kernels
from engine.config import EngineConfig
from engine.metrics import InflightThrottler, MetricsRecorder, StepMetrics, validate
from engine.model import precast
from engine.model.sharding import (
    LOGICAL_AXIS_RULES,
    LogicalRules,
    abstract_on,
    batch_sharding,
    is_abstract,
    named_shardings,
    on_mesh,
    optimizer_shardings,
    place_global_batch,
)
from engine.model.sharding import sharding_context as _sharding_context


class Kernel:
    """A compiled executable plus the count of its calls (executions)."""

    def __init__(self, name: str, compiled: jax.stages.Compiled | None,
                 lowered: jax.stages.Lowered, mesh: Mesh,
                 lower_for: Callable[[Mesh], jax.stages.Lowered]):
        """`compiled` None: compiled on first use (an abstract engine's kernels are lowered
        only; whoever plans them compiles them)."""
        self.name, self._compiled, self.lowered, self.calls = name, compiled, lowered, 0
        self.mesh, self._lower_for = mesh, lower_for

    @property
    def compiled(self) -> jax.stages.Compiled:
        if self._compiled is None:
            self._compiled = self.lowered.compile()
        return self._compiled

    def __call__(self, *args):
        self.calls += 1
        return self.compiled(*args)

    def lower_for(self, mesh: Mesh) -> jax.stages.Lowered:
        """This kernel's program (same shardings, same donation) lowered for `mesh`: a mesh of
        the same shape and axis names over other devices. With a TPU topology's compile-only
        devices, `.compile()` of the result is XLA's plan for that target, without its
        hardware (cost analysis, memory analysis, optimized HLO)."""
        if dict(mesh.shape) != dict(self.mesh.shape):
            raise ValueError(f"kernel {self.name} was compiled for mesh {dict(self.mesh.shape)};"
                             f" give a mesh of that shape, not {dict(mesh.shape)}")
        return self._lower_for(mesh)


def _signature(tree) -> Any:
    return jax.tree.map(lambda x: (tuple(x.shape), jnp.dtype(x.dtype).name), tree)


class TrainingEngine:
    """Trains any Flax NNX model with any optax transformation on a sum/sum workload loss."""

    def __init__(self, model: nnx.Module, tx: optax.GradientTransformation,
                 loss_fn: kernels.LossFn, *, mesh: Mesh,
                 rules: LogicalRules = LOGICAL_AXIS_RULES, config: EngineConfig | None = None):
        self.model, self.tx, self.loss_fn = model, tx, loss_fn
        self.mesh, self.rules = mesh, rules
        self.config = config or EngineConfig()
        self.kernels: dict[str, Kernel] = {}
        self.compile_seconds = 0.0
        self.steps_dispatched = 0
        self.recorder = MetricsRecorder(self.config.metrics_window, self.config.nan_policy)
        self.throttler = InflightThrottler(self.config.max_inflight)
        self._acc: kernels.Accumulator | None = None
        self._copies: tuple[jax.Array, ...] | None = None
        """This step's compute-dtype parameter copies (`cast_once_per_step`), from its first
        fwd_bwd to its update."""
        self._micro = 0
        self._compiled_for = None
        self.abstract = False
        """Built on an abstract model: kernels compile, never run (set by compile)."""
        self._cache_enabled = True
        self._update_cfg = kernels.UpdateConfig(
            jnp.dtype(self.config.grad_dtype) if self.config.grad_dtype else None,
            self.config.gradient_clipping_threshold)

    # ----------------------------------------------------------------------------- compile
    def sharding_context(self):
        return _sharding_context(self.mesh, self.rules)

    def compile(self, example_micro_batch, *, paths: Sequence[str] = ("split", "fused")) -> None:
        """AOT-compiles the kernels of `paths` for micro-batches shaped like the example.

        The first compile also splits the model once and places the train state; a later
        compile (new shapes) keeps the params, optimizer state and step as they are.
        "split" is fwd_bwd (first and accumulating) + update; "fused" is train_step.
        """
        unknown = set(paths) - {"split", "fused"}
        if unknown:
            raise ValueError(f"unknown kernel paths {sorted(unknown)}; valid: 'split', 'fused'")
        if self._micro:
            raise RuntimeError(f"{self._micro} micro-batches are mid-accumulation; finish the "
                               "step before compiling for other shapes")
        start = time.perf_counter()
        if self._compiled_for is None:
            self._split_model()
        self._compiled_for = _signature(example_micro_batch)
        self._batch_shardings = jax.tree.map(lambda x: batch_sharding(self.mesh, x.ndim),
                                             example_micro_batch)
        abstract_batch = self._abstract(example_micro_batch, self._batch_shardings)
        self._metric_shardings = self._check_metric_types(abstract_batch)
        self.kernels = {}
        if "split" in paths:
            self._compile_split(abstract_batch)
        if "fused" in paths:
            self._compile_fused(abstract_batch)
        self.compile_seconds = time.perf_counter() - start

    def _split_model(self) -> None:
        graph, state = nnx.split(self.model)  # once per compile: the pure-state cache
        params, rest = nnx.split_state(state, nnx.Param, ...)
        self._graph = graph
        casts = precast.compute_dtypes(params)
        self._casts = (casts if self.config.cast_once_per_step and any(casts)
                       and self.config.gradient_accumulation_steps > 1 else None)
        """Per param leaf, the dtype the split path's accumulating fwd_bwd reads it in from a
        copy made once per step; None where no copies are made."""
        self._param_shardings = named_shardings(params, self.mesh, self.rules)
        self._rest_shardings = named_shardings(rest, self.mesh, self.rules)
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self.abstract = is_abstract(params)
        if self.abstract:  # shapes only: the state a compiled plan would hold
            self._params = abstract_on(params, self._param_shardings)
            self._rest = abstract_on(rest, self._rest_shardings)
        else:
            # The engine owns its param buffers (updates donate them): a copy, so arrays
            # the caller built the model from stay valid.
            self._params = jax.device_put(params, self._param_shardings, may_alias=False)
            self._rest = jax.device_put(rest, self._rest_shardings)
        del params, rest, state
        # Published before the optimizer state exists: the model then holds the engine's
        # copy, and arrays only it held are freed, so a device never holds two copies of
        # the parameters beside the moments (4x the float32 parameters, where the train
        # state is 3x).
        self._live_variables = [v for _, v in nnx.iter_graph(self.model)
                                if isinstance(v, nnx.Variable)]
        self._publish_targets = None
        self._publish()
        self._opt_shardings = optimizer_shardings(self.tx, self._params, self._param_shardings,
                                                  self.mesh)
        init = jax.jit(self.tx.init, out_shardings=self._opt_shardings)
        step = jnp.zeros((), jnp.int32)
        with self.sharding_context():
            self._opt_state = (jax.eval_shape(init, self._params) if self.abstract
                               else init(self._params))
        self._step = (jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated)
                      if self.abstract else jax.device_put(step, self._replicated))
        self._acc_shardings = kernels.Accumulator(
            self._param_shardings, self._replicated, self._replicated)

    def _abstract(self, tree, shardings):
        return abstract_on(tree, shardings)

    def _lower_compile(self, name, fn, in_shardings, out_shardings, donate, *abstract_args):
        fn.__name__ = fn.__qualname__ = name  # traces and HLO dumps show jit_<kernel name>
        rules = self.rules

        def lower_for(mesh: Mesh) -> jax.stages.Lowered:
            jitted = jax.jit(fn, in_shardings=on_mesh(in_shardings, mesh),
                             out_shardings=on_mesh(out_shardings, mesh), donate_argnums=donate)
            with _sharding_context(mesh, rules), warnings.catch_warnings():
                # Rules + mesh around the lowering, not around jax.jit. JAX drops (and
                # notes) the donation of a buffer no output can be aliased to: the
                # update's accumulated gradient sums (see the module docstring).
                warnings.filterwarnings("ignore", "Some donated buffers were not usable")
                return jitted.lower(*on_mesh(abstract_args, mesh))

        lowered = lower_for(self.mesh)
        self.kernels[name] = Kernel(name, None if self.abstract else lowered.compile(), lowered,
                                    self.mesh, lower_for)

    def _check_metric_types(self, abstract_batch):
        """Refuses unsupported metric types before any step runs; returns their shardings."""
        graph, loss_fn = self._graph, self.loss_fn
        with self.sharding_context():
            _, _, metrics = jax.eval_shape(
                lambda p, r, b: kernels.fwd_bwd(graph, loss_fn, p, r, b),
                self._params, self._rest, abstract_batch)
        validate(metrics)
        return jax.tree.map(lambda _: self._replicated, metrics)

    def abstract_accumulator(self) -> kernels.Accumulator:
        """The accumulator's shapes and shardings (float32 gradient sums laid out like the
        params, replicated scalar sums)."""
        scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=self._replicated)
        return kernels.Accumulator(
            jax.tree.map(lambda p, s: jax.ShapeDtypeStruct(p.shape, jnp.float32, sharding=s),
                         self._params, self._param_shardings), scalar, scalar)

    def _compile_split(self, abstract_batch) -> None:
        graph, loss_fn, tx, cfg = self._graph, self.loss_fn, self.tx, self._update_cfg
        params = self._abstract(self._params, self._param_shardings)
        rest = self._abstract(self._rest, self._rest_shardings)
        acc = self.abstract_accumulator()
        metric_sh = self._metric_shardings
        fwd_out = (self._acc_shardings, self._rest_shardings, metric_sh)
        casts = self._casts
        if casts is None:
            first, first_out = (lambda p, r, b: kernels.fwd_bwd(graph, loss_fn, p, r, b)), fwd_out
        else:  # the first fwd_bwd also returns the copies the accumulating ones read
            copy_sh = precast.leaf_shardings(self._param_shardings, casts)
            first = (lambda p, r, b: (*kernels.fwd_bwd(graph, loss_fn, p, r, b),
                                      precast.copies(p, casts)))
            first_out = (*fwd_out, copy_sh)
        self._lower_compile(
            "fwd_bwd", first, (self._param_shardings, self._rest_shardings,
                               self._batch_shardings), first_out, (), params, rest, abstract_batch)
        if self.config.gradient_accumulation_steps > 1:
            if casts is None:
                weights, weight_sh = (params,), (self._param_shardings,)
                accumulate = (lambda a, p, r, b: kernels.fwd_bwd_accumulate(
                    graph, loss_fn, a, p, r, b))
            else:  # the model reads the copies in place of the float32 leaves they cast
                weights = (params, precast.copy_shapes(params, self._param_shardings, casts))
                weight_sh = (self._param_shardings, copy_sh)
                accumulate = kernels.accumulate_reading_copies(
                    graph, loss_fn, casts, self.config.copies_float32_gradient)
            self._lower_compile(
                "fwd_bwd_accumulate", accumulate,
                (self._acc_shardings, *weight_sh, self._rest_shardings, self._batch_shardings),
                fwd_out, (0,), acc, *weights, rest, abstract_batch)
        opt = self._abstract(self._opt_state, self._opt_shardings)
        step = jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated)
        self._lower_compile(
            "update", lambda p, o, s, a: kernels.apply_update(tx, cfg, p, o, s, a),
            (self._param_shardings, self._opt_shardings, self._replicated, self._acc_shardings),
            (self._param_shardings, self._opt_shardings, self._replicated, self._replicated),
            (0, 1, 3), params, opt, step, acc)

    def _compile_fused(self, abstract_batch) -> None:
        graph, loss_fn, tx, cfg = self._graph, self.loss_fn, self.tx, self._update_cfg
        ga = self.config.gradient_accumulation_steps
        # Specs, not shardings: the accumulator's layout follows whatever mesh the step is
        # lowered under (`Kernel.lower_for`), like every other sharding of the kernel.
        grad_sh = jax.tree.map(lambda s: s.spec, self._param_shardings)
        metric_sh = self._metric_shardings
        self._lower_compile(
            "train_step",
            lambda p, o, r, s, bs: kernels.fused_step(graph, loss_fn, tx, cfg, grad_sh, p, o, r,
                                                      s, bs),
            (self._param_shardings, self._opt_shardings, self._rest_shardings, self._replicated,
             (self._batch_shardings,) * ga),
            (self._param_shardings, self._opt_shardings, self._rest_shardings, self._replicated,
             self._replicated, metric_sh),
            (0, 1),
            self._abstract(self._params, self._param_shardings),
            self._abstract(self._opt_state, self._opt_shardings),
            self._abstract(self._rest, self._rest_shardings),
            jax.ShapeDtypeStruct((), jnp.int32, sharding=self._replicated),
            (abstract_batch,) * ga)

    # ------------------------------------------------------------------- pure-state cache
    def _publish(self) -> None:
        """Republishes the cached state into `engine.model` (same object, new arrays).

        The first publish after a split is `nnx.update` (a walk of the model graph), which
        also pairs every live Variable with its leaf of the cached state. Later publishes
        write each leaf straight into its paired Variable: the same effect without the
        graph walk (~4 ms/step for a 28-block model on this host's CPU).
        """
        leaves = jax.tree.leaves((self._params, self._rest))
        if self._publish_targets is None:
            nnx.update(self.model, nnx.merge_state(self._params, self._rest))
            by_id = {id(v.get_raw_value()): v for v in self._live_variables}
            targets = [by_id.get(id(leaf)) for leaf in leaves]
            if None not in targets and len(set(map(id, targets))) == len(targets):
                self._publish_targets = targets
        else:
            for variable, leaf in zip(self._publish_targets, leaves, strict=True):
                variable.set_raw_value(leaf)
        self._published = [v.get_raw_value() for v in self._live_variables]

    def _refresh_from_model(self) -> None:
        """Before a step: trust the cache unless `engine.model` was changed from outside."""
        if self._cache_enabled:
            live = self._live_variables
            if all(v.get_raw_value() is p for v, p in zip(live, self._published, strict=True)):
                return
            self._cache_enabled = False
            warnings.warn("engine.model was changed outside the engine since the last step; "
                          "the pure-state cache is disabled and the model is re-split every "
                          "step from now on", RuntimeWarning, stacklevel=3)
        graph, state = nnx.split(self.model)
        if graph != self._graph:
            raise ValueError("engine.model's structure changed after compile(); call "
                             "compile() again")
        params, rest = nnx.split_state(state, nnx.Param, ...)
        # Copies, as at compile: the arrays written into the model from outside may still
        # be held by their writer, and the next update donates these buffers.
        self._params = jax.device_put(params, self._param_shardings, may_alias=False)
        self._rest = jax.device_put(rest, self._rest_shardings)
        self._publish_targets = None  # the next publish pairs leaves and Variables again

    # ------------------------------------------------------------------------------ steps
    def _check_batch(self, micro_batch) -> None:
        if self._compiled_for is None:
            raise RuntimeError("call compile(example_micro_batch) before stepping")
        if self.abstract:
            raise RuntimeError("this engine was built on an abstract model (shapes, no "
                               "weights): its kernels can be compiled and inspected, not run")
        sig = _signature(micro_batch)
        if sig == self._compiled_for:
            return
        if self.config.shape_policy == "recompile":
            warnings.warn(f"micro-batch shapes changed from {self._compiled_for} to {sig}; "
                          "recompiling every kernel", RuntimeWarning, stacklevel=3)
            paths = {"fwd_bwd": "split", "train_step": "fused"}
            self.compile(micro_batch, paths=[p for k, p in paths.items() if k in self.kernels])
            return
        raise ValueError(f"micro-batch shapes {sig} differ from the compiled {self._compiled_for};"
                         " pad batches to the compiled shapes, call compile() again, or use "
                         "EngineConfig(shape_policy='recompile')")

    def place_batch(self, micro_batch):
        """Transfers a host micro-batch straight into the compiled batch sharding.

        A batch already on one device would otherwise be resharded by an extra execution
        on every call; numpy batches are transferred by the call itself and need no placing.
        Under jax.distributed every process passes the same global micro-batch and
        contributes its own rows.
        """
        return place_global_batch(micro_batch, self._batch_shardings)

    def _kernel(self, name: str) -> Kernel:
        if name not in self.kernels:
            path = "fused" if name == "train_step" else "split"
            raise RuntimeError(f"kernel {name!r} was not compiled; include {path!r} in "
                               "compile(paths=...)")
        return self.kernels[name]

    def fwd_bwd(self, micro_batch) -> None:
        """Forward/backward of one micro-batch into the accumulator (no optimizer step)."""
        ga = self.config.gradient_accumulation_steps
        if self._micro >= ga:
            raise RuntimeError(f"{self._micro} micro-batches already accumulated "
                               f"(gradient_accumulation_steps={ga}); call update()")
        self._check_batch(micro_batch)
        if self._micro == 0:
            self._refresh_from_model()
        with self.sharding_context():
            if self._acc is None:  # `is None`, never truthiness: a restored 0.0 step is real
                out = self._kernel("fwd_bwd")(self._params, self._rest, micro_batch)
                (self._acc, self._rest, metrics), copies = out[:3], out[3:]
                self._copies = copies[0] if copies else None
            else:
                params = (self._params,) if self._copies is None else (self._params,
                                                                       self._copies)
                self._acc, self._rest, metrics = self._kernel("fwd_bwd_accumulate")(
                    self._acc, *params, self._rest, micro_batch)
        self._micro += 1
        self.recorder.add(metrics)
        self.recorder.publish_pending()  # deferred past this dispatch

    def update(self) -> None:
        """Scales the accumulated gradient by 1/sum(denominators), clips, applies optax."""
        ga = self.config.gradient_accumulation_steps
        if self._micro != ga:
            raise RuntimeError(f"update() after {self._micro} micro-batches; "
                               f"gradient_accumulation_steps={ga}")
        self._copies = None  # freed once the last fwd_bwd that reads them is done
        with self.sharding_context():
            self._params, self._opt_state, self._step, finite = self._kernel("update")(
                self._params, self._opt_state, self._step, self._acc)
        self._acc, self._micro = None, 0
        self.steps_dispatched += 1
        self.throttler.push(self._step)
        self.recorder.end_step(self.steps_dispatched, finite)
        self._publish()

    def train_step(self, micro_batches: Sequence[Any]) -> None:
        """One optimizer step in one executable (fused fwd/bwd + update; scanned at GA > 1)."""
        ga = self.config.gradient_accumulation_steps
        if len(micro_batches) != ga:
            raise ValueError(f"train_step got {len(micro_batches)} micro-batches; "
                             f"gradient_accumulation_steps={ga}")
        if self._micro:
            raise RuntimeError(f"{self._micro} micro-batches are mid-accumulation; finish "
                               "them with fwd_bwd()/update() before train_step()")
        for mb in micro_batches:
            self._check_batch(mb)
        self._refresh_from_model()
        with self.sharding_context():
            (self._params, self._opt_state, self._rest, self._step, finite,
             metrics) = self._kernel("train_step")(self._params, self._opt_state, self._rest,
                                                   self._step, tuple(micro_batches))
        self.steps_dispatched += 1
        self.throttler.push(self._step)
        self.recorder.publish_pending()
        self.recorder.add_stacked(self.steps_dispatched, metrics, finite)
        self._publish()

    def block(self) -> None:
        """Waits for every dispatched step."""
        jax.block_until_ready((self._params, self._opt_state, self._step))

    # ---------------------------------------------------------------------------- results
    @property
    def params(self) -> nnx.State:
        return self._params

    @property
    def opt_state(self):
        return self._opt_state

    @property
    def rest(self) -> nnx.State:
        """The model's non-Param state (e.g. RNG counts), as the kernels hand it on."""
        return self._rest

    @property
    def accumulator(self) -> kernels.Accumulator | None:
        return self._acc

    def get_metrics(self) -> list[StepMetrics]:
        """Publishes pending steps and returns the kept history (oldest first)."""
        self.recorder.publish_pending()
        return list(self.recorder.history)

    def save_checkpoint(self, path) -> None:
        """Saves params, optimizer state, non-Param state, step and any partial accumulator."""
        self.recorder.publish_pending()
        checkpoint.save(path, checkpoint.Snapshot(
            state=(self._params, self._opt_state, self._rest, self._step),
            accumulator=self._acc, micro_batches_done=self._micro,
            steps_dispatched=self.steps_dispatched))

    def restore_checkpoint(self, path) -> None:
        """Restores a checkpoint into this (compiled) engine, mid-accumulation included."""
        if self._compiled_for is None:
            raise RuntimeError("compile() the engine before restore_checkpoint()")
        snap = checkpoint.restore(path, (self._params, self._opt_state, self._rest, self._step),
                                  self.abstract_accumulator())
        self._params, self._opt_state, self._rest, self._step = snap.state
        self._acc, self._micro = snap.accumulator, snap.micro_batches_done
        self.steps_dispatched = snap.steps_dispatched
        self._copies = None
        if self._micro and self._casts is not None:  # mid-step: the copies the rest read
            casts = self._casts
            shardings = precast.leaf_shardings(self._param_shardings, casts)
            with self.sharding_context():
                self._copies = jax.jit(lambda p: precast.copies(p, casts),
                                       out_shardings=shardings)(self._params)
        self._publish()

    def executions(self) -> int:
        """Total kernel executions dispatched so far (all kernels)."""
        return sum(k.calls for k in self.kernels.values())

    def close(self) -> None:
        """Waits for in-flight work and publishes the last metrics."""
        self.throttler.drain()
        self.recorder.publish_pending()
