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
