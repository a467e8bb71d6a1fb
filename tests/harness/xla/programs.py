"""Small programs compiled for TPU7x, counted by harness.xla.counts (run by the tests).

Loading libtpu changes a process's profiler (trace tests would see it), so this runs in a
process of its own: `python -m tests.harness.xla.programs` prints one JSON object, the
counts and what each program's arithmetic says they must be.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from harness.xla import counts, target

M, K, N, LAYERS = 256, 512, 1024, 6


def _counted(compiled) -> dict:
    text = compiled.as_text()
    found = counts.costs(text)
    return {"hbm": found.hbm_bytes, "flops": found.flops,
            "collectives": found.collective_bytes, "trips": found.trip_counts,
            "xla_flops": compiled.cost_analysis()["flops"]}


def main() -> dict:
    devices = target.topology_devices(target.TPU7X)
    one = NamedSharding(Mesh(np.array(devices[:1]), ("x",)), P())
    mesh = Mesh(np.array(devices), ("fsdp",))
    bf16 = jnp.bfloat16

    def shaped(shape, sharding=one, dtype=bf16):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    matmul = jax.jit(lambda x, w: x @ w).lower(shaped((M, K)), shaped((K, N))).compile()

    def layers(x, w_LxKxK):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, w_LxKxK)[0]

    scanned = jax.jit(layers).lower(shaped((M, K)), shaped((LAYERS, K, K))).compile()
    replicated, rows = NamedSharding(mesh, P()), NamedSharding(mesh, P("fsdp", None))
    # A weight sharded over 8 devices, wanted whole on each: one all-gather of all of it.
    gather = jax.jit(lambda w: w * 2, out_shardings=replicated).lower(
        shaped((K, N), rows)).compile()
    # The contracted dimension sharded: each device's partial product, summed by all-reduce.
    reduce = jax.jit(lambda x, w: x @ w, out_shardings=replicated).lower(
        shaped((M, K), NamedSharding(mesh, P(None, "fsdp"))), shaped((K, N), rows)).compile()
    # A loop whose bound is an argument: its trip count is not in the program.
    unbounded = jax.jit(lambda n, x: jax.lax.while_loop(
        lambda c: c[0] < n, lambda c: (c[0] + 1, jnp.tanh(c[1] @ c[1])), (0, x))[1]).lower(
        shaped((), dtype=jnp.int32), shaped((K, K))).compile()
    try:
        counts.costs(unbounded.as_text())
        refused = None
    except counts.Unavailable as err:
        refused = str(err)
    return {
        "unbounded_refused": refused,
        "matmul": {**_counted(matmul), "expected_flops": 2 * M * K * N,
                   "io_bytes": 2 * (M * K + K * N + M * N)},
        "scanned": {**_counted(scanned), "expected_flops": LAYERS * 2 * M * K * K,
                    "stack_bytes": 2 * LAYERS * K * K, "layers": LAYERS},
        "gather": {**_counted(gather), "weight_bytes": 2 * K * N,
                   "sparsecore_wrappers": gather.as_text().count("custom-call-start("),
                   "moved": [[e.instruction.opcode, e.costs.hbm_bytes]
                             for e in counts.entries(gather.as_text()) if e.costs.hbm_bytes]},
        "reduce": {**_counted(reduce), "output_bytes": 2 * M * N},
    }


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
