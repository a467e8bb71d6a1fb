"""A planted slowdown on the device: matmuls of a known FLOP count added to the native arm's
step. Test support for the chip's A/B, bisect and nightly checks; never part of the product.

A commit planting one adds two lines to the end of `arms/native.py`:

    import tests.harness.device_plant as _plant  # noqa: E402
    _plant.plant(GFLOP)

Every native step then does GFLOP more bfloat16 matmul work (a chain of `tanh(x @ w)` over
slices of the embedding table, held out of the gradient) and adds it times zero to the loss
it reports: the parameters, the optimizer state and the loss are unchanged, the device time
is not. Unlike `tests.harness.fault_arms`' host spin, the work is the device's own, so the
plan, the compiled cost and a trace all see it. Its time is the chip's to measure: on the
v5e, 190 GFLOP planted in native's 114.5 ms step at seq 1024 GA 1 added 2.7 ms (2.4%; `parity
ab`, 2026-12-07): ~14 us a GFLOP, the chain's matmuls at ~70 TFLOP/s, not the ~165 the
model's larger ones reach.
"""

from __future__ import annotations

import math

ROWS = 8192
"""Rows of the planted matmuls' left operand (fewer where the embedding has fewer)."""
WIDTH = 1024
"""Their inner and output width (less where the embedding is narrower)."""


def planted_shape(table_shape: tuple[int, int], gflop: float) -> tuple[int, int, int]:
    """(rows, width, matmuls) of the planted chain for an embedding of `table_shape`: the
    fewest [rows, width] x [width, width] matmuls that reach `gflop`."""
    rows, width = min(ROWS, table_shape[0]), min(WIDTH, table_shape[0], table_shape[1])
    return rows, width, max(1, math.ceil(gflop * 1e9 / (2 * rows * width * width)))


def planted_table(params):
    """The leaf the plant slices its matmuls from: the largest matrix (the embedding)."""
    import jax

    return max((x for x in jax.tree.leaves(params) if x.ndim == 2), key=lambda x: x.size)


def planted_step(native_step, gflop: float):
    """`native_step` (arms.native's) with the planted matmuls after it (module docstring)."""
    import jax
    import jax.numpy as jnp

    def step(graph, loss_fn, tx, clip, params, rest, opt_state, batches, **options):
        params, rest, opt_state, loss = native_step(graph, loss_fn, tx, clip, params, rest,
                                                    opt_state, batches, **options)
        table = planted_table(params)
        rows, width, count = planted_shape(table.shape, gflop)
        table = jax.lax.stop_gradient(table).astype(jnp.bfloat16)
        x, w = table[:rows, :width], table[:width, :width]
        for _ in range(count):  # unrolled: every matmul is in the program's cost as it runs
            x = jnp.tanh(x @ w)
        return params, rest, opt_state, loss + 0.0 * jnp.sum(x.astype(jnp.float32))

    return step


def plant(gflop: float) -> None:
    """Plants `gflop` GFLOP of device work in every step of the native arm (this process)."""
    import importlib

    # Called from the end of arms/native.py while that module is still being imported: the
    # module is in sys.modules, but not yet an attribute of the `arms` package.
    native = importlib.import_module("arms.native")
    native.native_step = planted_step(native.native_step, gflop)


PLANT_LINES = ("\n\nimport tests.harness.device_plant as _plant  # noqa: E402\n\n"
               "_plant.plant({gflop})\n")
"""What a planting commit appends to arms/native.py."""


def branch(repo: str, name: str, *, commits: int, at: int, gflop: float) -> list[str]:
    """Makes branch `name` in `repo`: `commits` commits on its HEAD, the `at`-th (from 1)
    planting `gflop` GFLOP in native's step (every later one keeps it), the others a line
    added to a file of their own (`plant-log.txt`); returns their SHAs, oldest first. Run
    in a temporary worktree, so the checkout's files and index stay as they are."""
    import subprocess
    import tempfile
    from pathlib import Path

    if not 1 <= at <= commits:
        raise ValueError(f"--at {at}: give the planting commit's place, 1 to {commits}")
    git = ["git", "-c", "user.name=parity plants", "-c", "user.email=plants@localhost"]

    def run(*args, cwd=repo) -> str:
        return subprocess.run([*git, *args], cwd=cwd, check=True, capture_output=True,
                              text=True).stdout.strip()

    shas = []
    with tempfile.TemporaryDirectory() as scratch:
        tree = Path(scratch) / "tree"
        run("worktree", "add", "-q", "-b", name, str(tree), "HEAD")
        try:
            for index in range(1, commits + 1):
                if index == at:
                    native = tree / "arms" / "native.py"
                    native.write_text(native.read_text() + PLANT_LINES.format(gflop=gflop))
                    message = f"plant {gflop:g} GFLOP of device work in native's step"
                else:
                    with open(tree / "plant-log.txt", "a") as log:
                        log.write(f"commit {index} of {commits}\n")
                    message = f"no-op commit {index} of {commits}"
                run("add", "-A", cwd=tree)
                run("commit", "-q", "-m", message, cwd=tree)
                shas.append(run("rev-parse", "HEAD", cwd=tree))
        finally:
            run("worktree", "remove", "--force", str(tree))
    return shas


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="make a branch of planted commits")
    parser.add_argument("name", help="the new branch")
    parser.add_argument("--commits", type=int, default=8)
    parser.add_argument("--at", type=int, default=5, help="the planting commit, 1-based")
    parser.add_argument("--gflop", type=float, default=380.0)
    args = parser.parse_args()
    for sha in branch(".", args.name, commits=args.commits, at=args.at, gflop=args.gflop):
        print(sha)
