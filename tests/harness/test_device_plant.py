"""tests.harness.device_plant: the planted device work is the FLOPs it names, in the native
arm's own compiled step, and changes nothing the step computes."""

import jax
import numpy as np

import arms.native
from arms.registry import make_arm
from arms.spec import CellSpec
from tests.harness.device_plant import planted_shape, planted_step

SPEC = CellSpec(preset="tiny", seq=32, batch=4, ga=2, ragged=(40, 8))


def test_a_plant_is_the_fewest_full_matmuls_that_reach_its_flops():
    """qwen3-0.6b's embedding (151,936 x 1,024): 380 GFLOP (~2% of native's 114 ms step on
    the v5e at its matmuls' ~165 TFLOP/s) is 23 matmuls of [8192, 1024] x [1024, 1024]."""
    assert planted_shape((151936, 1024), 380.0) == (8192, 1024, 23)
    assert planted_shape((256, 64), 1e-9) == (256, 64, 1)  # at least one
    assert planted_shape((48, 64), 1.0)[:2] == (48, 48)  # w is a square of the table


def _step_cost_and_state(monkeypatch, gflop: float | None):
    if gflop is not None:
        monkeypatch.setattr(arms.native, "native_step",
                            planted_step(arms.native.native_step, gflop))
    arm = make_arm("native", SPEC)
    flops = arm.plan().executables["step"].compile().cost_analysis()["flops"]
    arm.build()
    arm.step(arm.place(SPEC.micro_batches()))
    state = [np.asarray(x) for x in jax.tree.leaves(arm.state)]
    loss = arm.last_loss()
    arm.close()
    monkeypatch.undo()
    return flops, state, loss


def test_the_planted_step_costs_its_matmuls_more_and_computes_the_same(monkeypatch):
    gflop = 0.05
    base_flops, base_state, base_loss = _step_cost_and_state(monkeypatch, None)
    flops, state, loss = _step_cost_and_state(monkeypatch, gflop)
    table = max((x for x in jax.tree.leaves(base_state) if x.ndim == 2), key=lambda x: x.size)
    rows, width, count = planted_shape(table.shape, gflop)
    matmuls = count * 2 * rows * width * width
    # the matmuls, plus elementwise work XLA's cost model counts per element of x: each
    # tanh (a few FLOPs), the cast and the final sum; at most 4 an element a matmul (at
    # qwen3-0.6b's width 1024 that is 0.2% of the matmuls, here 3%)
    elementwise = count * 4 * rows * width
    assert matmuls <= flops - base_flops <= matmuls + elementwise, (flops - base_flops, matmuls)
    assert loss == base_loss
    assert all(np.array_equal(a, b) for a, b in zip(state, base_state, strict=True))
