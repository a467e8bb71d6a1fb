"""Rollout micro-batches: prompt + completion rows as Tunix's GRPO learner builds them."""

import dataclasses

import numpy as np
import pytest
from tunix.rl import common

from arms.spec import CellSpec
from arms.workload import data_digest, denominators
from arms.workload.rollouts import (
    EOS_ID,
    PAD_ID,
    completion_lengths,
    make_rollouts,
    prompt_len,
)

RAGGED = (64, 16, 40, 8)


def _rollouts(**kw):
    args = dict(seed=0, batch_size=4, seq_len=64, vocab_size=256, num_micro_batches=4,
                loss_tokens=RAGGED)
    return make_rollouts(**{**args, **kw})


def test_ragged_counts_are_each_micro_batch_completion_tokens_spread_unevenly():
    batches = _rollouts()
    assert denominators(batches) == [64.0, 16.0, 40.0, 8.0]
    rows = np.concatenate([b.loss_mask.sum(axis=1) for b in batches])
    assert len(set(rows.tolist())) > 4  # completion lengths differ across rows
    assert rows.max() <= 64 - prompt_len(64)


def test_rows_are_left_padded_prompts_then_completions_ending_in_eos_then_pads():
    for batch in _rollouts():
        p = prompt_len(batch.tokens.shape[1])
        for ids, mask in zip(batch.tokens, batch.loss_mask, strict=True):
            prompt, completion = ids[:p], ids[p:]
            real = np.flatnonzero(prompt != PAD_ID)
            assert real.size >= 1 and real[-1] == p - 1 and np.all(np.diff(real) == 1)
            n = int(mask[p:].sum())
            assert np.all(completion[n:] == PAD_ID) and np.all(completion[:n] != PAD_ID)
            assert np.all(mask[:p] == 0)
            if 0 < n < completion.size:  # ended before its slot: the last token is eos
                assert completion[n - 1] == EOS_ID and np.all(completion[:n - 1] > EOS_ID)
        # positions and segment ids are what Tunix derives from the pads
        tokens = batch.tokens
        _, positions, _, segments = common.process_ids(tokens[:, :p], tokens[:, p:],
                                                       PAD_ID, EOS_ID)
        np.testing.assert_array_equal(batch.positions, positions)
        np.testing.assert_array_equal(batch.segment_ids, segments)
        np.testing.assert_array_equal(batch.targets[:, :-1], tokens[:, 1:])


def test_advantages_are_tunix_group_relative_per_row():
    batches = _rollouts()
    adv = np.concatenate([b.advantages for b in batches])
    assert np.all(adv == adv[:, :1])  # one advantage per row
    groups = adv[:, 0].reshape(-1, 4)  # 16 rows: groups of 4 completions
    np.testing.assert_allclose(groups.mean(axis=1), 0.0, atol=1e-6)  # float32 sums of 4
    np.testing.assert_allclose(groups.std(axis=1, ddof=1), 1.0, rtol=1e-4)  # its 1e-6 eps


def test_same_seed_same_digest_other_seed_other():
    assert data_digest(_rollouts()) == data_digest(_rollouts())
    assert data_digest(_rollouts()) != data_digest(_rollouts(seed=1))


def test_bad_counts_and_batches_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="more completion tokens than the micro-batch holds"):
        _rollouts(loss_tokens=(129, 1, 1, 1))
    with pytest.raises(ValueError, match="give an even --batch"):
        CellSpec(loss="tunix-grpo", batch=3, ga=1)
    with pytest.raises(ValueError, match="only --loss tunix-grpo reads them"):
        CellSpec(loss="xent", beta=0.1)
    with pytest.raises(ValueError, match="aggregation modes"):
        CellSpec(loss="tunix-grpo", loss_agg_mode="mean-of-everything")


def test_unset_options_leave_every_other_cells_data_and_hash_as_it_was():
    data = CellSpec().to_dict()
    assert not {"loss_agg_mode", "beta", "epsilon", "epsilon_high", "epsilon_c"} & set(data)
    spec = CellSpec(loss="tunix-grpo", beta=0.04)
    assert spec.to_dict()["beta"] == 0.04 and "epsilon" not in spec.to_dict()
    assert CellSpec.from_dict(spec.to_dict()) == spec


def test_old_log_probs_are_the_initial_policys_computed_once_per_spec_and_step():
    spec = CellSpec(preset="tiny", seq=32, batch=4, ga=2, loss="tunix-grpo", beta=0.04)
    batches = spec.micro_batches(0)
    assert spec.micro_batches(0)[0] is batches[0]  # cached in the process
    p = prompt_len(spec.seq)
    for batch in batches:
        assert np.all(batch.old_logprobs[:, :p] == 0)
        logps = batch.old_logprobs[:, p:]
        assert np.all(logps <= 0) and np.all(np.isfinite(logps))
        np.testing.assert_array_equal(batch.ref_logprobs, batch.old_logprobs)
    shapes = spec.micro_batches(0, logprobs=False)
    assert [b.old_logprobs.shape for b in shapes] == [b.old_logprobs.shape for b in batches]
    assert np.all(shapes[0].old_logprobs == 0)
    no_kl = dataclasses.replace(spec, beta=0.0).micro_batches(0)
    assert no_kl[0].ref_logprobs is None
    np.testing.assert_array_equal(no_kl[0].old_logprobs, batches[0].old_logprobs)


def test_completion_lengths_without_counts_keep_about_the_fraction():
    rng = np.random.default_rng(0)
    lengths = completion_lengths(rng, 4000, 33, None, 0.7)
    assert lengths.min() >= 1 and lengths.max() <= 33
    assert abs(lengths.mean() / 33 - (1 + 0.7 * 32) / 33) < 0.01  # binomial mean, 4000 rows
