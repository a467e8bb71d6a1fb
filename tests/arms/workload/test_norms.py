"""arms.workload.reference.norms: the pytree norms every parity number is quoted in,
accumulated in float64 a chunk at a time."""

import ml_dtypes
import numpy as np
import pytest

from arms.workload.reference import CHUNK, global_norm, norms, rel_l2


def test_norms_in_chunks_equal_one_float64_pass_over_the_whole_trees():
    """Leaves larger than a chunk, of float32 and bfloat16, against numpy's norm of the
    concatenated float64 vectors (a second count of the same sums)."""
    rng = np.random.default_rng(0)
    a = {"big": rng.standard_normal((3, CHUNK // 2 + 7), dtype=np.float32),
         "small": rng.standard_normal(33).astype(ml_dtypes.bfloat16)}
    b = {"big": a["big"] + rng.standard_normal(a["big"].shape, dtype=np.float32) * 1e-3,
         "small": (a["small"].astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)}

    def flat(tree):
        return np.concatenate([tree[k].astype(np.float64).ravel() for k in ("big", "small")])

    want = (np.linalg.norm(flat(a)), np.linalg.norm(flat(b)),
            np.linalg.norm(flat(a) - flat(b)))
    assert norms(a, b) == pytest.approx(want, rel=1e-12)  # float64 sums in another order
    assert global_norm(a) == pytest.approx(want[0], rel=1e-12)
    assert rel_l2(a, b) == pytest.approx(want[2] / want[1], rel=1e-12)


def test_norms_refuse_trees_of_different_leaves():
    with pytest.raises(ValueError, match="same leaves"):
        norms({"a": np.zeros(2)}, {"a": np.zeros(2), "b": np.zeros(2)})
    with pytest.raises(ValueError, match="leaf shapes differ"):
        norms({"a": np.zeros(2)}, {"a": np.zeros(3)})


def test_distances_to_several_references_are_each_pair_s_norms_whatever_the_threads(
        monkeypatch):
    """One pass over `a` against three references: each pair's figures equal numpy's
    float64 norms of the concatenated vectors (a second count) to the bound `distances`
    states, and equal to the bit
    whether the chunks are summed in one thread or eight (sums added in chunk order)."""
    import arms.workload.reference as reference
    from arms.workload.reference import distances

    rng = np.random.default_rng(1)
    shape = (2, CHUNK // 2 + 5)
    a = {"w": rng.standard_normal(shape, dtype=np.float32), "b": rng.standard_normal(9)}
    refs = [{k: v + rng.standard_normal(v.shape).astype(v.dtype) * scale
             for k, v in a.items()} for scale in (1e-3, 1e-2, 1.0)]

    def flat(tree):
        return np.concatenate([tree[k].astype(np.float64).ravel() for k in ("w", "b")])

    norm_a, found = distances(a, refs)
    assert norm_a == pytest.approx(np.linalg.norm(flat(a)), rel=1e-12)
    for (norm_r, diff), ref in zip(found, refs, strict=True):
        assert norm_r == pytest.approx(np.linalg.norm(flat(ref)), rel=1e-12)
        # The difference is taken in float32: exact where two elements are within a factor
        # 2 of each other (the two nearer references), else within 2^-24 of itself.
        assert diff == pytest.approx(np.linalg.norm(flat(a) - flat(ref)), rel=2**-24)
    assert found[0][1] == pytest.approx(np.linalg.norm(flat(a) - flat(refs[0])), rel=1e-12)
    monkeypatch.setattr(reference, "THREADS", 1)
    assert distances(a, refs) == (norm_a, found)
    with pytest.raises(ValueError, match="leaf shapes differ"):
        distances(a, [refs[0], {"w": a["w"], "b": np.zeros(3)}])
