"""Test-only plugin: the gradient check of every cell fails the way PARITY_TEST_CHECK says,
after the cell has measured everything. Loaded into a cell with `--plugin
tests.harness.cell.failing_check`; never part of the product.

- `oom`: the exact reference asks the device for more memory than it has (XLA's own
  RESOURCE_EXHAUSTED, as a reference beside the arm's state ran out of HBM on a TPU v5e);
- `hang`: the reference never returns (the parent kills the cell at its timeout);
- `exit`: the process dies inside the check without a word (as a host OOM kill would).
"""

import os
import time

from harness.cell import reference

FAULT = os.environ.get("PARITY_TEST_CHECK", "oom")


def _failing_reference(*args, **kwargs):
    if FAULT == "hang":
        time.sleep(3600)
    if FAULT == "exit":
        os._exit(1)
    import jax.numpy as jnp

    jnp.zeros((1 << 44,), jnp.float32).block_until_ready()  # 64 TiB: RESOURCE_EXHAUSTED
    raise AssertionError("a 64 TiB allocation succeeded")


reference._compute_reference = _failing_reference
