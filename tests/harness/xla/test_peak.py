"""harness.xla.peak: what holds an executable's planned total, read from the buffer
assignment XLA itself dumps (XLA:CPU here; the plans read XLA:TPU's the same way)."""

import uuid

import jax
import jax.numpy as jnp

from harness.xla import peak

N = 256


def _compiled_rows(fn, tmp_path, *args):
    """(rows, planned total) of `fn` compiled here with its dump under tmp_path."""
    # A program never compiled before (its salt a constant of its own): the tests'
    # persistent compilation cache would serve a program seen before, and XLA dumps only
    # what it compiles.
    salt = uuid.uuid4().int % 2**20 / 2**40
    compiled = jax.jit(lambda x, w: fn(x + salt, w)).lower(*args).compile(
        compiler_options=peak.dump_options(tmp_path))
    analysis = compiled.memory_analysis()
    memory = {k: int(getattr(analysis, k)) for k in (
        "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
        "temp_size_in_bytes")}
    total = (memory["argument_size_in_bytes"] + memory["output_size_in_bytes"]
             - memory["alias_size_in_bytes"] + memory["temp_size_in_bytes"])
    return peak.from_dump(tmp_path, compiled.as_text(), memory), total


def _plain(x, w):
    return jnp.tanh(x @ w) @ w.T


def _one_more_buffer(x, w):
    """The same, with the square of w live beside the second product (one more f32[N,N]
    buffer in the temp heap at its peak)."""
    ww = w @ w
    return jnp.tanh(x @ w) @ w.T + jnp.tanh(x @ ww)


def test_the_rows_sum_to_the_planned_total_and_name_the_arguments(tmp_path):
    x, w = jnp.ones((N, N), jnp.float32), jnp.ones((N, N), jnp.float32)
    rows, total = _compiled_rows(_plain, tmp_path, x, w)
    assert sum(r.bytes for r in rows) == total
    arguments = [r for r in rows if r.section == peak.ARGUMENT]
    assert arguments == [peak.Group(peak.ARGUMENT, peak.PARAMETER, f"f32[{N},{N}]", 2,
                                    2 * N * N * 4)]
    assert any(r.section == peak.OUTPUT and r.shape == f"f32[{N},{N}]" for r in rows)


def test_a_buffer_added_at_the_peak_is_a_grown_row(tmp_path):
    x, w = jnp.ones((N, N), jnp.float32), jnp.ones((N, N), jnp.float32)
    before, total_a = _compiled_rows(_plain, tmp_path / "a", x, w)
    after, total_b = _compiled_rows(_one_more_buffer, tmp_path / "b", x, w)
    assert sum(r.bytes for r in after) == total_b and total_b > total_a
    temp = lambda rows: sum(r.bytes for r in rows
                            if r.section == peak.TEMP and r.defined_by != peak.REST)
    assert temp(after) - temp(before) >= N * N * 4  # at least the one more f32[N,N]


def test_the_temp_rows_are_the_heaps_busiest_point_by_a_second_count(tmp_path):
    """The point busiest_temp chooses holds the most temp bytes of any point, counted
    again here point by point, and they fit in the temp allocation."""
    x, w = jnp.ones((N, N), jnp.float32), jnp.ones((N, N), jnp.float32)
    _compiled_rows(_one_more_buffer, tmp_path, x, w)
    placed = peak.allocations(peak.dumped(tmp_path, peak.ASSIGNMENT_SUFFIX).read_text())
    spans = peak.live_ranges(peak.dumped(tmp_path, peak.LIVE_RANGE_SUFFIX).read_text())
    chosen = peak.busiest_temp(placed, peak.dumped(tmp_path, peak.LIVE_RANGE_SUFFIX).read_text())
    temp = [v for a in placed if a.section == peak.TEMP for v in a.values]
    assert chosen and temp and spans
    # live on [first, max(last, first + 1)): an in-place result replaces its operand
    by_point = [sum(v[3] for v in temp if spans[v[0], v[1]][0] <= t < max(
        spans[v[0], v[1]][1], spans[v[0], v[1]][0] + 1)) for t in range(
        max(last for _, last in spans.values()) + 2)]
    assert sum(v[3] for v in chosen) == max(by_point)
    (heap,) = [a for a in placed if a.section == peak.TEMP]
    assert sum(v[3] for v in chosen) <= heap.size
