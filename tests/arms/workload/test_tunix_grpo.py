"""Tunix's grpo_loss_fn as (sum, denominator): the decomposition is exact in every mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tunix.rl import algo_core, common

from arms.models.tunix_qwen3 import to_tunix
from arms.spec import CellSpec
from arms.workload import (
    concatenate,
    denominators,
    exact_loss_and_gradient,
    get_loss,
    rel_l2,
)
from arms.workload.rollouts import EOS_ID, PAD_ID, prompt_len
from arms.workload.tunix_call import TunixCall, tunix_module
from arms.workload.tunix_grpo import AGG_MODES
from engine.model import build_decoder
from reports.parity import GRAD_TOLERANCE

RTOL = 1e-5
"""float32: Tunix's value and sum/den each round a few hundred O(1) terms (~1e-7 apart)."""


@pytest.fixture(scope="module")
def cell():
    """A tiny policy and 4 ragged rollout micro-batches (the last one empty: Tunix clamps its
    0/0 to 0/1) whose old log-probs are moved off the policy's (so ratios leave 1, both clips
    and the dual clip act, and no value is ~0)."""
    spec = CellSpec(preset="tiny", seq=32, batch=8, ga=4, loss="tunix-grpo",
                    ragged=(30, 6, 20, 0), beta=0.04)
    rng = np.random.default_rng(1)
    batches = [b._replace(old_logprobs=b.old_logprobs + 0.5 * rng.standard_normal(
        b.old_logprobs.shape).astype(np.float32)) for b in spec.micro_batches()]
    return build_decoder(spec.model_config(), seed=spec.seed), batches


def _loss(mode):
    return get_loss("tunix-grpo", loss_agg_mode=mode, beta=0.04, epsilon_c=3.0)


def _tunix(model, loss, batch):
    value, _ = algo_core.grpo_loss_fn(tunix_module(model), loss.train_example(batch),
                                      loss.algo_config(), PAD_ID, EOS_ID)
    return float(value)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_one_micro_batch_sum_over_denominator_is_tunix_loss(cell, mode):
    model, batches = cell
    loss = _loss(mode)
    for batch in batches[:2]:
        out = loss(model, batch)
        expected = _tunix(model, loss, batch)
        assert abs(expected) > 1e-2  # a relative check of a value that is not ~0
        assert float(out.loss_sum / out.denominator) == pytest.approx(expected, rel=RTOL)


@pytest.mark.parametrize("mode", AGG_MODES)
def test_ragged_micro_batches_sum_over_sum_is_tunix_loss_on_their_concatenation(cell, mode):
    model, batches = cell
    loss = _loss(mode)
    outs = [loss(model, b) for b in batches]
    whole = float(sum(o.loss_sum for o in outs) / sum(o.denominator for o in outs))
    assert whole == pytest.approx(_tunix(model, loss, concatenate(batches)), rel=RTOL)
    # ... which the mean of Tunix's micro-batch values is not (the batches are ragged)
    means = np.mean([_tunix(model, loss, b) for b in batches])
    assert abs(means - whole) > 100 * RTOL * abs(whole)


def test_denominators_are_completion_tokens_or_non_empty_rows(cell):
    _, batches = cell
    p = prompt_len(batches[0].tokens.shape[1])
    tokens = [float(b.loss_mask.sum()) for b in batches]
    rows = [float((b.loss_mask[:, p:].sum(axis=1) > 0).sum()) for b in batches]
    assert denominators(batches, _loss("token-mean")) == tokens == [30.0, 6.0, 20.0, 0.0]
    assert denominators(batches, _loss("seq-mean-token-sum")) == rows
    assert rows == [2.0, 2.0, 2.0, 0.0]  # an empty micro-batch counts no row


def _tunix_gradient(model, loss, batch):
    """The gradient of Tunix's loss on one batch w.r.t. the model's Params."""
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    def value(params):
        return algo_core.grpo_loss_fn(tunix_module(nnx.merge(graph, params, rest)),
                                      loss.train_example(batch), loss.algo_config(), PAD_ID,
                                      EOS_ID)[0]

    return jax.grad(value)(params)


def test_exact_gradient_is_the_gradient_of_tunix_loss_on_the_whole_batch(cell):
    model, batches = cell
    for mode in ("token-mean", "sequence-mean-token-mean"):
        loss = _loss(mode)
        _, exact = exact_loss_and_gradient(model, batches, loss)
        whole = _tunix_gradient(model, loss, concatenate(batches))
        assert rel_l2(exact, whole) <= GRAD_TOLERANCE, mode


def test_our_decoder_through_tunix_call_gives_tunix_qwen3s_log_probs(cell):
    """Tunix's dense mask on Tunix's Qwen3 and segment ids on our decoder (TunixCall) agree
    on every completion token: the same weights, the same per-token log-probs."""
    model, batches = cell
    batch = batches[0]
    p = prompt_len(batch.tokens.shape[1])

    def logps(module):
        graph, state = nnx.split(module)
        return np.asarray(common.compute_per_token_logps(
            graph, state, prompt_tokens=jnp.asarray(batch.tokens[:, :p]),
            completion_tokens=jnp.asarray(batch.tokens[:, p:]), pad_id=PAD_ID, eos_id=EOS_ID))

    ours, theirs = logps(TunixCall(model)), logps(tunix_module(to_tunix(model)))
    mask = batch.loss_mask[:, p:] > 0
    np.testing.assert_allclose(ours[mask], theirs[mask], atol=1e-5)  # float32 logits ~1e-6
