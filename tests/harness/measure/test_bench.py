"""Microbenchmark of the timing loop itself (run with --benchmark-enable for numbers)."""

import jax
import jax.numpy as jnp

from harness.measure.timing import timed_steps


def test_bench_timing_wrapper_overhead_per_step(benchmark):
    ready = jax.block_until_ready(jnp.zeros(()))
    step_ms, dispatch_ms, wait_ms = benchmark(
        timed_steps, lambda: ready, 1000, jax.block_until_ready)
    assert len(step_ms) == len(dispatch_ms) == len(wait_ms) == 1000
    assert all(s >= d for s, d in zip(step_ms, dispatch_ms, strict=True))
