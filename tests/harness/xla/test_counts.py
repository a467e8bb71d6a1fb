"""harness.xla.counts on programs compiled here (XLA:CPU), each count checked against XLA's
own cost model of the same program: a second count of the same thing."""

import jax
import jax.numpy as jnp
import pytest
from jax import lax

from harness.xla import counts

# (lhs shape, rhs shape, strides, padding, lhs dilation, rhs dilation, layout, groups)
CONVOLUTIONS = {
    # What XLA:TPU writes for a batched einsum of attention's backward (tiny's per-head
    # gradient): the window stands for 4 heads, padded 3 each side, so each output
    # position has one tap that reads data and three that read padding.
    "window-as-batch": ((64, 64, 1), (64, 4, 16), (1,), [(3, 3)], (1,), (1,),
                        ("NCH", "IHO", "NHC"), 1),
    "strided-dilated": ((2, 8, 10, 12), (4, 8, 3, 3), (2, 1), [(1, 2), (0, 1)], (1, 2),
                        (2, 1), ("NCHW", "OIHW", "NCHW"), 1),
    "grouped-input-dilated": ((2, 8, 16), (8, 2, 5), (1,), [(4, 4)], (3,), (1,),
                              ("NCH", "OIH", "NCH"), 4),
}


@pytest.mark.parametrize("name", CONVOLUTIONS)
def test_a_convolution_counts_what_xlas_cost_model_counts(name):
    """Only (output position, tap) pairs that read an input element are multiplications:
    a tap on the padding, or between the elements of a dilated input, is not."""
    lhs, rhs, strides, padding, lhs_dilation, rhs_dilation, layout, groups = (
        CONVOLUTIONS[name])
    compiled = jax.jit(lambda x, w: lax.conv_general_dilated(
        x, w, strides, padding, lhs_dilation, rhs_dilation, layout,
        feature_group_count=groups)).lower(jnp.ones(lhs), jnp.ones(rhs)).compile()
    assert counts.costs(compiled.as_text()).flops == compiled.cost_analysis()["flops"]


def test_the_window_as_batch_convolution_by_hand():
    """2 x 64 input features x 16 output features x batch 64 x 4 output positions, one tap
    each: a quarter of 2 x output elements x the whole window (4 taps)."""
    lhs, rhs, *rest = CONVOLUTIONS["window-as-batch"]
    strides, padding, lhs_dilation, rhs_dilation, layout, _ = rest
    compiled = jax.jit(lambda x, w: lax.conv_general_dilated(
        x, w, strides, padding, lhs_dilation, rhs_dilation, layout)).lower(
        jnp.ones(lhs), jnp.ones(rhs)).compile()
    flops = counts.costs(compiled.as_text()).flops
    assert flops == 2 * 64 * 16 * 64 * 4 == (2 * 64 * 4 * 16 * (64 * 4)) / 4
