"""Model FLOPs against MaxText's own formula; loop-aware compiled cost on real jitted programs."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax import lax

from arms.models.maxtext_qwen3 import maxtext_config
from engine.model import build_decoder, get_preset
from harness.flops import compiled_cost, model_flops, model_flops_per_step

# ------------------------------------------------------------------------- model FLOPs
DEVICES = 8
"""MaxText counts per device for per_device_batch_size rows; the conftest's 8 CPU devices all
hold batch (fsdp=8), so the step's rows are per_device_batch_size * 8."""


@pytest.mark.parametrize("preset", ["tiny", "small", "qwen3-0.6b"])
def test_model_flops_equal_maxtexts_formula_over_all_devices(preset):
    from maxtext.utils.maxtext_utils import calculate_tflops_training_per_device

    config, per_device_batch, seq = get_preset(preset, remat="full"), 2, 64
    mx = maxtext_config(config, mesh_shape={"fsdp": DEVICES}, seq=seq,
                        per_device_batch_size=per_device_batch)
    batch = per_device_batch * DEVICES
    assert mx.global_batch_size_to_train_on == batch  # the mapping MaxText itself uses
    total_tflops, weight_tflops, attention_tflops = calculate_tflops_training_per_device(
        mx, log=False)
    ours = model_flops(config, batch=batch, seq=seq)
    # rel 1e-6: both are the same closed form; only float rounding of MaxText's /1e12 differs.
    assert ours.weights == pytest.approx(weight_tflops * 1e12 * DEVICES, rel=1e-6)
    assert ours.attention == pytest.approx(attention_tflops * 1e12 * DEVICES, rel=1e-6)
    assert model_flops_per_step(config, batch=batch, seq=seq) == pytest.approx(
        total_tflops * 1e12 * DEVICES, rel=1e-6)


def test_model_flops_ignore_scan_and_remat_and_scale_linearly_in_batch():
    base = model_flops_per_step(get_preset("small"), batch=4, seq=128)
    for scan_layers in (False, True):
        for remat in ("none", "full"):
            config = get_preset("small", scan_layers=scan_layers, remat=remat)
            assert model_flops_per_step(config, batch=4, seq=128) == base
    assert model_flops_per_step(get_preset("small"), batch=12, seq=128) == 3 * base
    # Attention is quadratic in seq, so doubling seq more than doubles the count.
    assert model_flops_per_step(get_preset("small"), batch=4, seq=256) > 2 * base
    with pytest.raises(ValueError, match="positive"):
        model_flops_per_step(get_preset("small"), batch=0, seq=128)


def test_model_flops_by_hand_for_tiny():
    # tiny: V=256 D=64 layers=2 N=4 K=2 H=16 F=128; batch 1 x seq 8 tokens.
    tokens, seq = 8, 8
    per_layer = (2 * tokens * 128 * 64 * 3            # SwiGLU: wi_0, wi_1, wo
                 + 2 * tokens * 64 * (4 + 2 * 2) * 16  # q, k, v
                 + 2 * tokens * 64 * 4 * 16)           # attention out
    weights = 3 * (2 * per_layer + 2 * tokens * 64 * 256)  # + unembedding, x3 fwd+bwd
    attention = 3 * 2 * (4 * seq * seq * 4 * 16 / 2)       # causal half, x3, 2 layers
    flops = model_flops(get_preset("tiny"), batch=1, seq=seq)
    assert (flops.weights, flops.attention, flops.total) == (weights, attention,
                                                            weights + attention)


# ---------------------------------------------------------------------- compiled cost
ROWS, WIDTH = 8, 64
MATMUL_FLOPS = 2 * ROWS * WIDTH * WIDTH
# A loop adds its counter increment (1 flop per trip) and compare (1 per condition run) to the
# matmuls: a few flops against 65536 per matmul, so rel 1e-3 holds any such bookkeeping.
LOOP_REL = 1e-3


def _compile(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def _operands():
    return jnp.ones((ROWS, WIDTH)), jnp.full((WIDTH, WIDTH), 0.01)


def _step(carry, weight):
    return jnp.tanh(carry @ weight)


def test_a_program_without_loops_keeps_xlas_numbers():
    cost = compiled_cost(_compile(_step, *_operands()))
    assert cost.reason is None and cost.trip_counts == []
    assert (cost.flops, cost.bytes_accessed) == (cost.xla_flops, cost.xla_bytes_accessed)
    assert cost.flops == MATMUL_FLOPS  # tanh is a transcendental, not a flop


def test_a_scan_of_four_costs_four_steps():
    def scanned(x, w):
        return lax.scan(lambda c, _: (_step(c, w), None), x, None, length=4)[0]

    single = compiled_cost(_compile(_step, *_operands()))
    cost = compiled_cost(_compile(scanned, *_operands()))
    assert cost.reason is None and cost.trip_counts == [4]
    assert cost.flops == pytest.approx(4 * single.flops, rel=LOOP_REL)
    assert cost.xla_flops == pytest.approx(single.flops, rel=LOOP_REL)  # the body, once
    # Every iteration reads the carry and weight and writes the carry: > 3x one step's bytes
    # (the one-step program reads the same operands once).
    assert cost.bytes_accessed > 3 * single.bytes_accessed > 0


def test_nested_scans_multiply_out():
    def nested(x, w):
        def outer(c, _):
            return lax.scan(lambda c2, _: (_step(c2, w), None), c, None, length=5)[0], None
        return lax.scan(outer, x, None, length=3)[0]

    cost = compiled_cost(_compile(nested, *_operands()))
    assert cost.reason is None and cost.trip_counts == [3, 5]  # outer loop first
    assert cost.flops == pytest.approx(15 * MATMUL_FLOPS, rel=LOOP_REL)
    assert cost.xla_flops == pytest.approx(MATMUL_FLOPS, rel=LOOP_REL)


def test_a_data_dependent_loop_gives_none_and_says_why():
    def until(x, w, bound):
        return lax.while_loop(lambda s: s[0] < bound,
                              lambda s: (s[0] + 1, _step(s[1], w)), (0, x))[1]

    cost = compiled_cost(_compile(until, *_operands(), 3))
    assert cost.flops is None and cost.bytes_accessed is None
    assert "no known trip count" in cost.reason
    assert cost.xla_flops == pytest.approx(MATMUL_FLOPS, rel=LOOP_REL)  # still reported


def test_a_loop_inside_a_conditional_gives_none_and_says_why():
    # XLA costs a conditional as its costliest branch, so a loop correction inside a branch
    # would not add up; it must be refused, not under-counted.
    def branchy(x, w, predicate):
        scanned = lambda c: lax.scan(lambda c2, _: (_step(c2, w), None), c, None, length=4)[0]
        return lax.cond(predicate, scanned, lambda c: 2 * c, x)

    cost = compiled_cost(_compile(branchy, *_operands(), True))
    assert cost.flops is None and "conditional" in cost.reason


def _decoder_grad_cost(scan_layers: bool):
    """Loop-aware cost of d(sum of logits)/d(params) of the tiny decoder: fwd + bwd."""
    batch, seq = 2, 32
    model = build_decoder(get_preset("tiny", scan_layers=scan_layers), seed=0)
    graph, params = nnx.split(model)
    positions = jnp.broadcast_to(jnp.arange(seq), (batch, seq))
    segment_ids = jnp.ones((batch, seq), jnp.int32)

    def loss(params, tokens):
        return nnx.merge(graph, params)(tokens, positions, segment_ids).sum()

    return compiled_cost(_compile(jax.grad(loss), params, jnp.zeros((batch, seq), jnp.int32)))


def test_scanned_decoder_costs_what_the_unrolled_one_does():
    unrolled, scanned = _decoder_grad_cost(False), _decoder_grad_cost(True)
    assert unrolled.trip_counts == [] and unrolled.flops == unrolled.xla_flops
    layers = get_preset("tiny").num_layers
    assert scanned.reason is None and scanned.trip_counts == [layers, layers]  # fwd, bwd
    # 2%: the scanned program does the same math plus loop bookkeeping and slicing of the
    # stacked weights (measured ~0.1% apart on jax 0.11.2 CPU).
    assert scanned.flops == pytest.approx(unrolled.flops, rel=0.02)
    # XLA's own number counts each scanned layer once: it misses (layers-1)/layers of the
    # layer work (measured 0.56x of the true count for 2 layers), so the fix matters.
    assert scanned.xla_flops < 0.8 * scanned.flops
