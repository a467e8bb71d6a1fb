"""The attention kernels compiled for one TPU v5e chip by libtpu (compile-only devices; no chip
needed), run by the tests in a process of their own: loading libtpu changes a process's
profiler, which the trace tests would see. Usage: `python -m tests.engine.model.tpu_attention`;
prints one JSON object.

- `decoder`: per (attention option, seq), the Pallas kernels (`tpu_custom_call`s) in the
  compiled gradient of the decoder's loss statistics, traced under a mesh of the v5e's
  device: what `attention="auto"` picks when the program is for a TPU; and the same with
  splash over 4 chips (v5e:2x2, fsdp=4), which compiles only if each device runs the kernel
  on its own rows (Mosaic kernels cannot be partitioned by XLA).
- `layer`: one qwen3-0.6b layer's attention (16 query heads, 8 kv heads, head dim 128, bf16,
  causal, packed), forward and backward, by XLA and by splash at the default blocks: the
  kernels in it and XLA:TPU's planned temporary bytes.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from engine.model import (
    abstract_decoder,
    batch_sharding,
    get_preset,
    make_mesh,
    sharding_context,
)
from engine.model.attention import attend, splash
from engine.model.decoder import attention_mask
from harness.xla import target

KERNEL = "tpu_custom_call"


def _shaped(shape, dtype, mesh):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))


def decoder_kernels(attention: str, seq: int, mesh) -> int:
    """Pallas kernels in the compiled gradient of tiny's loss statistics at `seq`, one row
    per device of `mesh`."""
    config = get_preset("tiny", attention=attention, scan_layers=True, remat="full")
    graph, state = nnx.split(abstract_decoder(config, mesh))
    rows = [jax.ShapeDtypeStruct((mesh.size, seq), jnp.int32, sharding=batch_sharding(mesh))
            for _ in range(4)]

    def loss(state, tokens, positions, segment_ids, targets):
        model = nnx.merge(graph, state)
        return jnp.sum(model.token_logprobs(tokens, positions, segment_ids, targets)[0])

    with sharding_context(mesh):
        lowered = jax.jit(jax.grad(loss)).lower(state, *rows)
    return target.compile_plan(lowered).as_text().count(KERNEL)


def layer_plan(kind: str, batch: int, seq: int, mesh) -> dict:
    """Kernels and planned temporary bytes of one qwen3-0.6b layer's attention, fwd + bwd."""
    k_heads, groups, head_dim = 8, 2, 128
    q = _shaped((batch, seq, k_heads, groups, head_dim), jnp.bfloat16, mesh)
    kv = _shaped((batch, seq, k_heads, head_dim), jnp.bfloat16, mesh)
    segments = _shaped((batch, seq), jnp.int32, mesh)

    def attention(q, k, v, segment_ids):
        if kind == "xla":
            return attend(q, k, v, attention_mask(segment_ids))
        return splash(q, k, v, segment_ids, block_q=512, block_kv=1024, interpret=False)

    def objective(q, k, v, segment_ids):
        return jnp.sum(attention(q, k, v, segment_ids).astype(jnp.float32))

    compiled = target.compile_plan(
        jax.jit(jax.grad(objective, argnums=(0, 1, 2))).lower(q, kv, kv, segments))
    return {"kernels": compiled.as_text().count(KERNEL),
            "temp_bytes": compiled.memory_analysis().temp_size_in_bytes}


def main() -> dict:
    devices = target.topology_devices("v5e:1x1")
    mesh = target.mesh_like(make_mesh(""), devices)
    one = jax.sharding.Mesh(np.array(devices[:1]), ("one",))
    four = target.mesh_like(make_mesh("fsdp=4"), target.topology_devices("v5e:2x2"))
    return {
        "device_kind": devices[0].device_kind,
        "decoder": {f"{attention}@{seq}": decoder_kernels(attention, seq, mesh)
                    for attention, seq in (("auto", 4096), ("auto", 1024), ("splash", 1024))},
        "fsdp=4": decoder_kernels("splash", 1024, four),
        "layer": {f"{kind}@{batch}x{seq}": layer_plan(kind, batch, seq, one)
                  for kind in ("xla", "splash") for batch, seq in ((1, 4096),)},
    }


if __name__ == "__main__":
    print(json.dumps(main()), flush=True)
