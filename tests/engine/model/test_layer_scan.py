"""engine.model.layer_scan: the scanned blocks differentiated into an unfilled gradient buffer
(`DecoderConfig.scan_backward="unfilled"`) compute the gradient of JAX's own scan transpose,
without the zeros JAX writes over the stacked weight gradient first.

Tolerance: both ways run the same operations on the same float32 values (each layer's forward
recomputed from its saved input, then its transpose); XLA may fuse the two programs apart,
which reorders a few float32 roundings (2^-24 relative each) per element over the two layers'
chains of a few dozen operations: REORDER_TOL = 64 * 2^-24, ~4e-6 relative l2. On this
machine the two agree to the bit."""

import re

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from arms.workload import make_micro_batches, rel_l2, target_logprobs
from engine.model import build_decoder, get_preset, make_mesh, sharding_context

REORDER_TOL = 64 * 2.0**-24

SCANNED = get_preset("tiny", scan_layers=True, remat="full")


def _loss(graph, batch):
    def loss(state):
        logprob, logz = target_logprobs(nnx.merge(graph, state), batch)
        return -jnp.sum(logprob) + 1e-3 * jnp.sum(jnp.square(logz))
    return loss


def _loss_and_grad(config, batch, mesh=None):
    """(loss, gradient, the weights the gradient is of)."""
    graph, state = nnx.split(build_decoder(config, seed=0, mesh=mesh))
    step = jax.jit(jax.value_and_grad(_loss(graph, batch)))
    if mesh is None:
        return *step(state), state
    with sharding_context(mesh):
        return *step(state), state


@pytest.mark.parametrize("mesh", [None, "fsdp=2,tensor=2"])
def test_the_unfilled_backward_is_jax_s_scan_gradient(devices, mesh):
    batch = make_micro_batches(seed=3, batch_size=4, seq_len=32, vocab_size=256)[0]
    mesh = make_mesh(mesh) if mesh else None
    loss, grad, _ = _loss_and_grad(SCANNED, batch, mesh)
    unfilled_loss, unfilled_grad, weights = _loss_and_grad(
        SCANNED.replace(scan_backward="unfilled"), batch, mesh)
    assert float(unfilled_loss) == float(loss)  # the forward is the same scan
    assert rel_l2(nnx.to_pure_dict(unfilled_grad), nnx.to_pure_dict(grad)) <= REORDER_TOL
    if mesh is not None:  # each layer's gradient laid out like its weights
        layers = zip(jax.tree.leaves(unfilled_grad["layers"]),
                     jax.tree.leaves(weights["layers"]), strict=True)
        assert all(g.sharding.is_equivalent_to(w.sharding, g.ndim) for g, w in layers)


def _zero_filled_stacks(config) -> tuple[int, int]:
    """(zero broadcasts shaped like a stacked weight, uninitialized allocations) in the
    gradient program lowered for a TPU (the lowering is the platform's; no chip needed)."""
    graph, state = nnx.split(build_decoder(config, seed=0))
    batch = make_micro_batches(seed=3, batch_size=2, seq_len=32, vocab_size=256)[0]
    text = jax.jit(jax.grad(_loss(graph, batch))).trace(state).lower(
        lowering_platforms=("tpu",)).as_text()
    stacked = {tuple(leaf.shape) for leaf in jax.tree.leaves(nnx.state(
        nnx.eval_shape(lambda: build_decoder(config, seed=0)).layers))}
    zeros = re.findall(r"broadcast_in_dim %\S+, dims = \[\] : \(tensor<f32>\) -> "
                       r"tensor<([0-9x]+)xf32>", text)
    filled = sum(tuple(map(int, shape.split("x"))) in stacked for shape in zeros)
    return filled, text.count("AllocateBuffer")


def test_the_unfilled_backward_writes_no_zeros_over_the_stacked_gradient():
    """JAX's transpose starts each of the 11 stacked weight gradients (q, k, v, o, the norms,
    gate, up, down) as zeros; the unfilled backward allocates them uninitialized instead."""
    assert _zero_filled_stacks(SCANNED) == (11, 0)
    assert _zero_filled_stacks(SCANNED.replace(scan_backward="unfilled")) == (0, 11)


@pytest.mark.parametrize("overrides", [{"scan_layers": False}, {"remat": "minimal"},
                                       {"remat": "none"}])
def test_the_unfilled_backward_needs_scanned_fully_rematerialized_blocks(overrides):
    with pytest.raises(ValueError, match=r"scan_backward='unfilled' differentiates scanned "
                                         r"blocks by recomputing each one: give "
                                         r"scan_layers=True and remat='full'"):
        SCANNED.replace(scan_backward="unfilled", **overrides)
    with pytest.raises(ValueError, match=r"scan_backward='filled'; valid: 'jax', 'unfilled'"):
        SCANNED.replace(scan_backward="filled")
