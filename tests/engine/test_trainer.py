"""Acceptance: exactness, executions per step, bad input."""

import jax
import numpy as np
import optax
import pytest

from arms.capture import captured_gradient, with_capture
from arms.workload import TokenCrossEntropy, exact_loss_and_gradient, make_micro_batches, rel_l2
from tests.engine.conftest import RAGGED, ragged_batches, traced_executions


def run_split(engine, batches):
    for mb in batches:
        engine.fwd_bwd(mb)
    engine.update()


@pytest.mark.parametrize("path", ["split", "fused"])
def test_ga4_ragged_gradient_and_logged_loss_are_exact(engine_factory, path):
    batches = ragged_batches()
    engine = engine_factory(ga=4, paths=(path,))
    dens = [float(b.loss_mask.sum()) for b in batches]
    assert dens == RAGGED and len(set(dens)) == 4
    exact_loss, exact = exact_loss_and_gradient(engine.model, batches, TokenCrossEntropy())
    if path == "split":
        run_split(engine, batches)
    else:
        engine.train_step(batches)
    assert rel_l2(captured_gradient(engine.opt_state), exact) <= 1e-5
    (record,) = engine.get_metrics()
    expected = record.micro_batch_loss_sums.sum() / record.micro_batch_denominators.sum()
    assert abs(record.loss - expected) <= 1e-6 * abs(expected)
    assert abs(record.loss - exact_loss) <= 1e-6 * abs(exact_loss)
    np.testing.assert_array_equal(record.micro_batch_denominators, RAGGED)


def test_split_and_fused_paths_reach_the_same_weights(engine_factory):
    batches = ragged_batches()
    split, fused = engine_factory(ga=4, paths=("split",)), engine_factory(ga=4, paths=("fused",))
    for _ in range(2):
        run_split(split, batches)
        fused.train_step(batches)
    assert rel_l2(fused.params, split.params) <= 1e-6


@pytest.mark.parametrize(("ga", "path", "expected"), [
    (1, "split", 2), (4, "split", 5), (1, "fused", 1), (4, "fused", 1)])
def test_executions_per_optimizer_step_from_the_trace(engine_factory, ga, path, expected):
    batches = ragged_batches() if ga == 4 else ragged_batches(counts=[40])
    engine = engine_factory(ga=ga, paths=(path,), example=batches[0])
    batches = [engine.place_batch(b) for b in batches]
    step = (lambda: run_split(engine, batches)) if path == "split" else (
        lambda: engine.train_step(batches))
    calls_before = engine.executions()
    counts = traced_executions(engine, step)
    assert counts == [expected] * 3  # the trace: no extra eager dispatch
    assert engine.executions() - calls_before == 4 * expected  # the counting wrapper agrees


def test_gradients_come_back_sharded_like_the_params(engine_factory):
    batches = ragged_batches(counts=[64, 16, 40, 8], batch_size=8)
    engine = engine_factory(ga=2, mesh="fsdp=8", paths=("split",), example=batches[0])
    engine.fwd_bwd(batches[0])
    grads, params = engine.accumulator.grads, engine.params
    sharded = 0
    for g, p in zip(jax.tree.leaves(grads), jax.tree.leaves(params), strict=True):
        assert g.sharding == p.sharding
        sharded += not p.sharding.is_fully_replicated
    assert sharded >= 10


def test_optimizer_state_is_sharded_like_the_params(engine_factory):
    """FSDP shards the optimizer state too: each AdamW moment and the captured gradient
    like its param, the step count replicated; the update moves no state between devices."""
    engine = engine_factory(ga=1, mesh="fsdp=8", paths=("split",),
                            example=ragged_batches(counts=[64], batch_size=8)[0])
    params = jax.tree.leaves(engine.params)
    state = jax.tree.leaves(engine.opt_state)
    moments = [x for x in state if x.ndim]
    assert len(moments) == 3 * len(params)  # capture, mu, nu
    for i, leaf in enumerate(moments):
        assert leaf.sharding == params[i % len(params)].sharding
    assert all(x.sharding.is_fully_replicated for x in state if not x.ndim)
    assert "all-gather" not in engine.kernels["update"].compiled.as_text()


def test_nan_loss_raises_naming_step_and_micro_batch_and_keeps_weights(engine_factory):
    batches = ragged_batches()
    engine = engine_factory(ga=4, paths=("split",))
    run_split(engine, batches)
    before = jax.device_get(engine.params)
    bad = batches[2]._replace(loss_mask=np.where(batches[2].loss_mask > 0, np.nan, 0.0)
                              .astype(np.float32))
    run_split(engine, [batches[0], batches[1], bad, batches[3]])
    with pytest.raises(FloatingPointError, match="non-finite loss at step 2, micro-batch 2"):
        engine.get_metrics()
    assert rel_l2(engine.params, before) == 0.0


def test_nan_policy_skip_counts_the_step_and_keeps_weights(engine_factory):
    batches = ragged_batches()
    engine = engine_factory(ga=4, paths=("fused",), nan_policy="skip")
    before = jax.device_get(engine.params)
    bad = batches[0]._replace(loss_mask=np.full_like(batches[0].loss_mask, np.nan))
    engine.train_step([bad, *batches[1:]])
    engine.train_step(batches)
    first, second = engine.get_metrics()
    assert not first.applied and second.applied
    assert int(engine._step) == 1
    assert rel_l2(engine.params, before) > 0


def test_other_shapes_are_refused_with_the_fix(engine_factory):
    engine = engine_factory(ga=1, paths=("split",))
    longer = make_micro_batches(seed=0, batch_size=2, seq_len=64, vocab_size=256)[0]
    with pytest.raises(ValueError, match=r"differ from the compiled.*shape_policy='recompile'"):
        engine.fwd_bwd(longer)
    assert engine.executions() == 0


def test_other_shapes_recompile_with_one_warning_when_asked(engine_factory):
    engine = engine_factory(ga=1, paths=("split",), shape_policy="recompile")
    run_split(engine, ragged_batches(counts=[40]))
    trained = jax.device_get(engine.params)
    longer = make_micro_batches(seed=0, batch_size=2, seq_len=64, vocab_size=256)[0]
    with pytest.warns(RuntimeWarning, match="recompiling") as record:
        engine.fwd_bwd(longer)
        assert rel_l2(engine.params, trained) == 0.0  # the trained state survives recompiling
        engine.update()
        engine.fwd_bwd(longer)
        engine.update()
    assert len([w for w in record if "recompiling" in str(w.message)]) == 1
    assert int(engine._step) == 3 and int(engine.opt_state[1][0].count) == 3


def test_unknown_metric_type_is_refused_at_compile(engine_factory):
    def loss_with_vector_aux(model, batch):
        out = TokenCrossEntropy()(model, batch)
        return out.loss_sum, out.denominator, {"per_token": batch.loss_mask}

    with pytest.raises(TypeError, match=r"metric 'aux.per_token' must be a numeric scalar"):
        engine_factory(loss=loss_with_vector_aux)


def test_protocol_misuse_is_refused(engine_factory):
    engine = engine_factory(ga=2, paths=("split",))
    batches = ragged_batches(counts=[10, 20])
    with pytest.raises(RuntimeError, match=r"update\(\) after 0 micro-batches"):
        engine.update()
    with pytest.raises(RuntimeError, match="'train_step' was not compiled; include 'fused'"):
        engine.train_step(batches)
    with pytest.raises(ValueError, match="train_step got 1 micro-batches"):
        engine.train_step(batches[:1])


def test_clipping_bounds_the_gradient_the_optimizer_sees(engine_factory):
    batches = ragged_batches()
    engine = engine_factory(ga=4, paths=("fused",), gradient_clipping_threshold=0.05,
                            tx=with_capture(optax.sgd(0.1)))
    engine.train_step(batches)
    norm = optax.tree.norm(captured_gradient(engine.opt_state))
    assert abs(float(norm) - 0.05) <= 1e-6


def test_an_engine_on_an_abstract_model_lowers_the_same_kernels_and_refuses_to_run(devices):
    """A model of shapes (`abstract_decoder`) gives kernels whose compiled memory plan is the
    real engine's, with nothing allocated for the state; stepping it is refused."""
    from engine import EngineConfig, TrainingEngine
    from engine.model import abstract_decoder, get_preset, make_mesh
    from tests.engine.conftest import make_engine

    real = make_engine(ga=2, mesh="fsdp=2", paths=("split",))
    mesh = make_mesh("fsdp=2")
    abstract = TrainingEngine(abstract_decoder(get_preset("tiny"), mesh),
                              with_capture(optax.adamw(1e-3)), TokenCrossEntropy(), mesh=mesh,
                              config=EngineConfig(gradient_accumulation_steps=2))
    example = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           ragged_batches()[0])
    abstract.compile(example, paths=("split",))
    assert abstract.abstract and not real.abstract
    assert all(isinstance(x, jax.ShapeDtypeStruct)
               for x in jax.tree.leaves((abstract.params, abstract.opt_state)))
    assert all(k._compiled is None for k in abstract.kernels.values())  # lowered only
    for name, kernel in real.kernels.items():
        assert (abstract.kernels[name].compiled.memory_analysis().argument_size_in_bytes
                == kernel.compiled.memory_analysis().argument_size_in_bytes), name
    with pytest.raises(RuntimeError, match="built on an abstract model"):
        abstract.fwd_bwd(example)
