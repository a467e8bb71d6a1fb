"""Microbenchmarks (pytest-benchmark): run with `--benchmark-enable` to get timings.

Under `make test` benchmarks are disabled and each body runs once as a plain test, which
still checks that both sides of a comparison compute the same thing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from arms.workload import TokenCrossEntropy
from engine import TrainingEngine
from engine.kernels import MicroBatchMetrics
from engine.metrics import MetricsRecorder
from engine.model import Decoder, get_preset, make_mesh

# The variable count of qwen3-0.6b (28 blocks) at tiny widths: the graph walk is what costs.
DEEP = get_preset("tiny", num_layers=28)


@pytest.fixture(scope="module")
def deep_model():
    return Decoder(DEEP, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def deep_engine(deep_model):
    mesh = make_mesh(None)
    engine = TrainingEngine(deep_model, optax.sgd(0.1), TokenCrossEntropy(), mesh=mesh)
    engine._split_model()  # the compile-time split and first publish, without compiling
    return engine


def test_bench_republish_cached_pure_state(benchmark, deep_engine):
    """What the engine does per step instead of re-splitting: write the kernel outputs back."""
    benchmark(deep_engine._publish)
    assert deep_engine._publish_targets is not None
    assert all(v.get_raw_value() is leaf for v, leaf in zip(
        deep_engine._publish_targets, jax.tree.leaves(deep_engine.params), strict=False))


def test_bench_republish_with_nnx_update(benchmark, deep_engine):
    """The same publish through nnx.update (a graph walk per step)."""
    merged = nnx.merge_state(deep_engine.params, deep_engine._rest)
    benchmark(nnx.update, deep_engine.model, merged)
    assert deep_engine.model.embedding.get_raw_value() is deep_engine.params["embedding"][...]


def test_bench_split_the_graph_every_step(benchmark, deep_model):
    _, state = benchmark(nnx.split, deep_model)
    assert len(jax.tree.leaves(state)) == 28 * 11 + 2


GA, METRICS = 4, 3


def _micro_batch_values():
    values = [MicroBatchMetrics(jnp.float32(i), jnp.float32(2 * i + 1), {"z": jnp.float32(i)})
              for i in range(GA)]
    return jax.block_until_ready(values)


def test_bench_metrics_host_buffer_and_one_flush(benchmark):
    values = _micro_batch_values()
    recorder = MetricsRecorder(window=1_000_000, nan_policy="raise")
    finite = jnp.bool_(True)

    def step():
        for m in values:
            recorder.add(m)
        recorder.end_step(1, finite)
        recorder.publish_pending()
        return recorder.history[-1]

    record = benchmark(step)
    np.testing.assert_array_equal(record.micro_batch_loss_sums, np.arange(GA))


def test_bench_metrics_per_micro_batch_jnp_append(benchmark):
    values = _micro_batch_values()

    def step():
        loss, den, z = jnp.zeros((0,)), jnp.zeros((0,)), jnp.zeros((0,))
        for m in values:  # one device op per metric per micro-batch
            loss = jnp.append(loss, m.loss_sum)
            den = jnp.append(den, m.denominator)
            z = jnp.append(z, m.aux["z"])
        return jax.device_get((loss, den, z))

    loss, _, _ = benchmark(step)
    np.testing.assert_array_equal(loss, np.arange(GA))
