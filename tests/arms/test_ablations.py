"""arms.ablations: the engine arm with one host-path optimization switched off does the
same work (the same gradient, to the bit) and changes exactly the behaviour it names."""

import dataclasses

import jax
import numpy as np
from flax import nnx

from arms import ablations
from arms.registry import make_arm
from arms.spec import CellSpec

SPEC = CellSpec(preset="tiny", seq=32, batch=8, ga=2, ragged=(64, 16))


def _steps(name, steps=3, monkeypatch=None, splits=None, spec=SPEC):
    arm = make_arm(name, spec)
    arm.build()
    batches = arm.place(spec.micro_batches())
    history = []
    if splits is not None:
        real = nnx.split
        monkeypatch.setattr(nnx, "split", lambda *a, **k: splits.append(1) or real(*a, **k))
    for _ in range(steps):
        arm.step(batches)
        history.append(len(arm.engine.recorder.history))
    if splits is not None:
        monkeypatch.setattr(nnx, "split", real)
    # the gradient the optimizer saw is read back from its state after exactly one update
    first = np.concatenate([np.ravel(x) for x in jax.tree.leaves(
        arm.seen_gradient())]) if steps == 1 else None
    return arm, history, first


def test_every_ablation_does_the_engines_work_to_the_bit():
    _, _, engine = _steps("engine", steps=1)
    for name in {**ablations.ABLATIONS, **ablations.CANDIDATES}:
        arm, _, grad = _steps(name, steps=1)
        assert np.array_equal(grad, engine), name
        assert arm.about().startswith(f"plugin arm {name} on ")
        arm.close()


def test_without_the_state_cache_every_step_splits_the_model_graph(monkeypatch):
    splits = []
    arm, _, _ = _steps("engine", monkeypatch=monkeypatch, splits=splits)
    assert splits == []  # the cached pure state is reused
    arm.close()
    arm, _, _ = _steps("engine-no-state-cache", monkeypatch=monkeypatch, splits=splits)
    assert len(splits) == 3  # one split of the whole graph per step
    arm.close()


def test_eager_metrics_read_each_step_before_the_next_is_dispatched():
    arm, deferred, _ = _steps("engine")
    assert deferred == [0, 1, 2]  # step k is read after step k + 1's first dispatch
    arm.close()
    arm, eager, _ = _steps("engine-eager-metrics")
    assert eager == [1, 2, 3]
    arm.close()


def test_unbounded_metrics_keep_every_step():
    arm, _, _ = _steps("engine")
    assert arm.engine.recorder.history.maxlen == 128
    arm.close()
    arm, _, _ = _steps("engine-unbounded-metrics")
    assert arm.engine.recorder.history.maxlen == ablations.UNBOUNDED
    assert arm.engine.config.metrics_window == ablations.UNBOUNDED
    arm.close()


def test_casting_every_micro_batch_reads_no_copies_and_computes_the_same_bits():
    """In bfloat16 (where the decoder's block weights are read cast) the engine's
    accumulating fwd/bwd reads the copies its step's first one made; the ablation's casts
    the weights itself and takes none. The same gradient to the bit."""
    spec = dataclasses.replace(SPEC, dtype="bfloat16")
    grads = {}
    for name in ("engine", "engine-cast-per-micro-batch"):
        arm, _, grads[name] = _steps(name, steps=1, spec=spec)
        args, _ = arm.engine.kernels["fwd_bwd_accumulate"].lowered.args_info
        copies = (arm.engine._casts is not None, len(args) == 5)  # + the copies
        assert copies == ((True, True) if name == "engine" else (False, False)), name
        arm.close()
    assert np.array_equal(grads["engine"], grads["engine-cast-per-micro-batch"])


def test_the_float32_copy_gradient_candidate_stores_each_layers_gradient_in_float32():
    """With the weights cast once per step, the accumulating program's backward over the
    scanned layers stores each layer's weight gradient into a stack of the copies' dtype
    (bfloat16); the candidate differentiates the float32 parameters through the copies, so
    that stack is float32 (the values the same: the bits are, test above). Read from the
    program as JAX lowers it, the dynamic-update-slices of the MLP's output weights
    [layers, F, D]: what a backend compiles from (the CPU compiler of jaxlib 0.10.2 widens
    bfloat16 stores to float32 itself; the v5e plan's keeps them, docs/tpu-v5e.md)."""
    import re

    spec = dataclasses.replace(SPEC, dtype="bfloat16", scan_layers=True, remat="full")
    c = spec.model_config()
    wo = f"{c.num_layers}x{c.mlp_dim}x{c.embed_dim}"
    stored = {}
    for name in ("engine", "engine-copies-float32-gradient"):
        arm = make_arm(name, spec)
        arm.build()
        text = arm.engine.kernels["fwd_bwd_accumulate"].lowered.as_text()
        stored[name] = set(re.findall(r"dynamic_update_slice[^\n]*-> tensor<" + wo + r"x(\w+)>",
                                      text))
        arm.close()
    assert stored == {"engine": {"bf16"}, "engine-copies-float32-gradient": {"f32"}}, stored
