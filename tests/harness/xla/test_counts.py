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


_NESTED_SLICE = """HloModule nested_slice

%slice_layer (p0: bf16[28,1024,3072], p1: s32[]) -> bf16[1024,3072] {
  %p0 = bf16[28,1024,3072]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,1024,3072]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,1024,3072}
  ROOT %layer = bf16[1024,3072]{1,0} bitcast(%ds)
}

%whole_layer (p0: bf16[28,1024,3072]) -> bf16[28,1024,3072] {
  %p0 = bf16[28,1024,3072]{2,1,0} parameter(0)
  ROOT %neg = bf16[28,1024,3072]{2,1,0} negate(%p0)
}

%matmul (q0: bf16[28,1024,3072], q1: s32[], q2: bf16[2,1024]) -> bf16[2,3072] {
  %q0 = bf16[28,1024,3072]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = bf16[2,1024]{1,0} parameter(2)
  %w = bf16[1024,3072]{1,0} fusion(%q0, %q1), kind=kLoop, calls=%slice_layer
  ROOT %dot = bf16[2,3072]{1,0} dot(%q2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%matmul_whole (q0: bf16[28,1024,3072], q1: s32[], q2: bf16[2,1024]) -> bf16[2,3072] {
  %q0 = bf16[28,1024,3072]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = bf16[2,1024]{1,0} parameter(2)
  %all = bf16[28,1024,3072]{2,1,0} fusion(%q0), kind=kLoop, calls=%whole_layer
  %w = bf16[1024,3072]{1,0} fusion(%all, %q1), kind=kLoop, calls=%slice_layer
  ROOT %dot = bf16[2,3072]{1,0} dot(%q2, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[28,1024,3072], i: s32[], x: bf16[2,1024]) -> bf16[2,3072] {
  %a = bf16[28,1024,3072]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = bf16[2,1024]{1,0} parameter(2)
  ROOT %f = bf16[2,3072]{1,0} fusion(%a, %i, %x), kind=kOutput, calls=%{callee}
}
"""
STACK_BYTES, LAYER_BYTES = 28 * 1024 * 3072 * 2, 1024 * 3072 * 2
OTHER_BYTES = 4 + 2 * 1024 * 2 + 2 * 3072 * 2
"""The index (s32), the activations read and the product written."""


def test_a_slice_fused_in_a_nested_fusion_reads_the_slice_not_the_stack():
    """XLA:TPU fuses a scanned layer's slice of a stacked weight into the matmul that reads
    it as a fusion nested in the matmul's: one layer's bytes are read, not the 28 layers'.
    Where the nested fusion reads the stack whole (here it negates every layer first), the
    whole stack is counted."""
    sliced = counts.hbm_bytes(_NESTED_SLICE.replace("{callee}", "matmul"))
    assert sliced == LAYER_BYTES + OTHER_BYTES
    whole = counts.hbm_bytes(_NESTED_SLICE.replace("{callee}", "matmul_whole"))
    assert whole == STACK_BYTES + OTHER_BYTES
