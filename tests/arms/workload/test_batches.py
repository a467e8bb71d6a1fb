import numpy as np
import pytest

from arms.workload import data_digest, denominators, make_micro_batches

RAGGED = [64, 16, 40, 8]


def test_ragged_denominators_are_exactly_the_counts_and_pairwise_distinct():
    batches = make_micro_batches(seed=0, batch_size=4, seq_len=32, vocab_size=256,
                                 loss_tokens=RAGGED)
    dens = denominators(batches)
    assert dens == [64.0, 16.0, 40.0, 8.0]
    assert len(set(dens)) == len(dens)


def test_same_seed_same_digest_other_seed_other_digest():
    kw = dict(batch_size=2, seq_len=32, vocab_size=256, loss_tokens=RAGGED)
    a, b = make_micro_batches(seed=3, **kw), make_micro_batches(seed=3, **kw)
    assert data_digest(a) == data_digest(b)
    assert data_digest(a) != data_digest(make_micro_batches(seed=4, **kw))
    tweaked = [a[0]._replace(loss_mask=a[0].loss_mask * 2), *a[1:]]
    assert data_digest(tweaked) != data_digest(a)


def test_rows_pack_documents_with_positions_restarting_per_segment():
    (batch,) = make_micro_batches(seed=0, batch_size=3, seq_len=24, vocab_size=100,
                                  segments_per_row=3)
    for row in range(3):
        seg, pos = batch.segment_ids[row], batch.positions[row]
        assert sorted(set(seg.tolist())) == [1, 2, 3]
        starts = np.flatnonzero(np.diff(seg)) + 1
        assert all(pos[s] == 0 for s in starts) and pos[0] == 0
    np.testing.assert_array_equal(batch.tokens[:, 1:], batch.targets[:, :-1])


def test_mask_fraction_and_grpo_fields():
    (batch,) = make_micro_batches(seed=0, batch_size=8, seq_len=64, vocab_size=100,
                                  mask_fraction=0.25, grpo=True)
    assert 0.15 < batch.loss_mask.mean() < 0.35
    assert batch.advantages.shape == batch.old_logprobs.shape == (8, 64)


def test_ragged_count_longer_than_the_micro_batch_is_refused():
    with pytest.raises(ValueError, match=r"ragged count 80 \(micro-batch 0\) is longer than the "
                                         r"micro-batch holds \(2 rows x seq 32 = 64 tokens\)"):
        make_micro_batches(seed=0, batch_size=2, seq_len=32, vocab_size=10, loss_tokens=[80])
    with pytest.raises(ValueError, match="4 ragged loss-token counts for 2 micro-batches"):
        make_micro_batches(seed=0, batch_size=2, seq_len=32, vocab_size=10,
                           num_micro_batches=2, loss_tokens=RAGGED)
