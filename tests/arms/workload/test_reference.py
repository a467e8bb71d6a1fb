import jax
import numpy as np
import pytest
from flax import nnx

from arms.workload import (
    ClippedPolicyGradient,
    TokenCrossEntropy,
    concatenate,
    exact_by_micro_batch,
    exact_gradient,
    exact_loss_and_gradient,
    get_loss,
    make_micro_batches,
    rel_l2,
)
from engine.model import Decoder, get_preset

RAGGED = [64, 16, 40, 8]


@pytest.fixture(scope="module")
def model():
    return Decoder(get_preset("tiny"), rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def ragged():
    return make_micro_batches(seed=0, batch_size=2, seq_len=32, vocab_size=256,
                              loss_tokens=RAGGED)


def _grad_of_concatenated(model, batches, loss):
    graph, params = nnx.split(model)
    big = concatenate(batches)

    def f(p):
        out = loss(nnx.merge(graph, p), big)
        return out.loss_sum / out.denominator

    return jax.grad(f)(params)


def test_exact_gradient_equals_gradient_of_concatenated_sum_over_sum(model, ragged):
    loss = TokenCrossEntropy()
    assert rel_l2(exact_gradient(model, ragged, loss),
                  _grad_of_concatenated(model, ragged, loss)) <= 1e-6


def test_the_reference_by_micro_batch_is_the_one_program_reference(model, ragged):
    """The cell's reference (one micro-batch on the device at a time, summed on the host) is
    the same sum/sum gradient: float32 terms added in another order, ~1e-7 apart, held to
    1e-6 (a mean of means is 1e-1 off, below)."""
    for loss in (TokenCrossEntropy(), TokenCrossEntropy(z_loss_weight=1e-2)):
        value, grads = exact_loss_and_gradient(model, ragged, loss)
        chunked_value, chunked = exact_by_micro_batch(model, ragged, loss)
        assert rel_l2(chunked, nnx.to_pure_dict(grads)) <= 1e-6
        assert abs(chunked_value - value) <= 1e-6 * abs(value)
        assert all(g.dtype == np.float32 for g in jax.tree.leaves(chunked))


def test_mean_of_micro_batch_means_is_far_from_exact(model, ragged):
    loss = TokenCrossEntropy()
    graph, params = nnx.split(model)

    def mean_of_means(p):
        outs = [loss(nnx.merge(graph, p), mb) for mb in ragged]
        return sum(o.loss_sum / o.denominator for o in outs) / len(outs)

    assert rel_l2(jax.grad(mean_of_means)(params), exact_gradient(model, ragged, loss)) > 1e-2


def test_z_loss_is_part_of_the_differentiated_objective(model, ragged):
    plain, _ = exact_loss_and_gradient(model, ragged, TokenCrossEntropy())
    value, grads = exact_loss_and_gradient(model, ragged, TokenCrossEntropy(z_loss_weight=1e-2))
    out = TokenCrossEntropy(z_loss_weight=1e-2)(model, ragged[0])
    assert value > plain
    assert float(out.aux["z_loss_sum"]) > 0
    assert np.isclose(float(out.loss_sum), float(out.aux["xent_sum"] + out.aux["z_loss_sum"]))
    assert rel_l2(grads, exact_gradient(model, ragged, TokenCrossEntropy())) > 1e-6


def test_grpo_loss_at_ratio_one_is_minus_mean_advantage(model):
    (batch,) = make_micro_batches(seed=2, batch_size=2, seq_len=16, vocab_size=256, grpo=True)
    logits = model(batch.tokens, batch.positions, batch.segment_ids)
    logp = jax.nn.log_softmax(logits)
    old = np.take_along_axis(np.asarray(logp), np.asarray(batch.targets)[..., None], -1)[..., 0]
    out = ClippedPolicyGradient()(model, batch._replace(old_logprobs=old))
    expected = -(batch.advantages * batch.loss_mask).sum()
    np.testing.assert_allclose(float(out.loss_sum), expected, rtol=1e-5)
    assert float(out.aux["clipped_tokens_sum"]) == 0.0


def test_grpo_needs_grpo_batches_and_unknown_loss_lists_valid(model, ragged):
    with pytest.raises(ValueError, match="grpo=True"):
        ClippedPolicyGradient()(model, ragged[0])
    with pytest.raises(ValueError, match="unknown loss 'mse'; valid losses: xent, grpo"):
        get_loss("mse")


def test_rel_l2_is_zero_on_self_and_refuses_mismatched_trees():
    a = {"x": np.ones(3), "y": np.arange(4.0)}
    assert rel_l2(a, a) == 0.0
    assert rel_l2({"x": 2 * np.ones(3), "y": 2 * np.arange(4.0)}, a) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="same leaves"):
        rel_l2({"x": np.ones(3)}, a)
