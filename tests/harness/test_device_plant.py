"""tests.harness.device_plant: the planted device work is the FLOPs it names, in the native
arm's own compiled step, and changes nothing the step computes."""

import jax
import numpy as np

import arms.native
from arms.registry import make_arm
from arms.spec import CellSpec
from tests.harness.device_plant import planted_shape, planted_step, planted_table

SPEC = CellSpec(preset="tiny", seq=32, batch=4, ga=2, ragged=(40, 8))


def test_a_plant_is_the_fewest_full_matmuls_that_reach_its_flops():
    """qwen3-0.6b's embedding (151,936 x 1,024): 380 GFLOP is 23 matmuls of [8192, 1024] x
    [1024, 1024]."""
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
    rows, width, count = planted_shape(planted_table(base_state).shape, gflop)
    matmuls = count * 2 * rows * width * width
    # the matmuls, plus elementwise work XLA's cost model counts per element of x: each
    # tanh (a few FLOPs), the cast and the final sum; at most 4 an element a matmul (at
    # qwen3-0.6b's width 1024 that is 0.2% of the matmuls, here 3%)
    elementwise = count * 4 * rows * width
    assert matmuls <= flops - base_flops <= matmuls + elementwise, (flops - base_flops, matmuls)
    assert loss == base_loss
    assert all(np.array_equal(a, b) for a, b in zip(state, base_state, strict=True))


def test_a_plant_branch_plants_once_and_keeps_it(tmp_path):
    """Eight commits on a clone's HEAD, the fifth planting: only it touches arms/native.py,
    every later one still carries the plant, the clone's own checkout is untouched, and the
    planting commit's arms/native.py imports with its step planted."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.harness.device_plant import PLANT_LINES, branch

    repo = Path(__file__).resolve().parents[2]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True,
                          text=True, check=True).stdout.strip()
    shas = branch(str(clone), "plants", commits=8, at=5, gflop=380)

    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=clone, capture_output=True, text=True,
                              check=True).stdout

    assert len(shas) == 8 and git("rev-parse", "plants").strip() == shas[-1]
    assert git("rev-list", f"{head}..plants").split() == shas[::-1]
    touched = [git("show", "--name-only", "--format=", sha).split() for sha in shas]
    assert touched[4] == ["arms/native.py"]
    assert all(t == ["plant-log.txt"] for n, t in enumerate(touched) if n != 4)
    for sha in shas[4:]:
        assert git("show", f"{sha}:arms/native.py").endswith(PLANT_LINES.format(gflop=380))
    assert PLANT_LINES.format(gflop=380) not in git("show", f"{shas[3]}:arms/native.py")
    assert git("rev-parse", "HEAD").strip() == head and git("status", "--porcelain") == ""

    # The planting commit's arms/native.py imports, its step planted (the plant is applied
    # while arms.native is still being imported: this checkout's plant module, copied in)
    git("checkout", "-q", shas[4])
    (clone / "tests" / "harness" / "device_plant.py").write_text(
        (repo / "tests" / "harness" / "device_plant.py").read_text())
    imported = subprocess.run(
        [sys.executable, "-c", "import arms.native; print(arms.native.native_step.__qualname__)"],
        cwd=clone, capture_output=True, text=True, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert imported.stdout.split() == ["planted_step.<locals>.step"], imported.stderr[-2000:]
