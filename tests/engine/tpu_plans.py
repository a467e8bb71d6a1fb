"""Plans the engine's kernels for TPU7x in a process of their own (run by the tests).

Loading libtpu into a process changes its profiler: trace captures taken afterwards carry
the HLO of every program, so the trace tests would see it. Usage:
`python -m tests.engine.tpu_plans MESH...`, with 8 emulated CPU devices; prints one JSON
object per mesh.
"""

import json
import sys

import jax

from engine.model import make_mesh, precast
from harness.xla import counts, target
from tests.engine.conftest import bytes_per_device, make_engine, ragged_batches


def plan(mesh: str) -> dict:
    engine = make_engine(ga=2, mesh=mesh, example=ragged_batches(batch_size=4)[0])
    devices = target.topology_devices(target.TPU7X)
    tpu_mesh = target.mesh_like(engine.mesh, devices)
    # Every kernel (the split ones and the fused step with its GA scan) must lower and compile.
    plans = {name: target.compile_plan(kernel.lower_for(tpu_mesh))
             for name, kernel in engine.kernels.items()}
    update = plans["update"].as_text()
    try:
        engine.kernels["update"].lower_for(
            target.mesh_like(make_mesh("fsdp=2,tensor=2"), devices))
        refusal = None
    except ValueError as err:
        refusal = str(err)
    param_bytes = bytes_per_device(engine.params)
    return {"mesh": mesh, "kernels": sorted(plans), "param_bytes": param_bytes,
            "update_hbm_bytes": counts.hbm_bytes(update),
            "update_xla_bytes": plans["update"].cost_analysis()["bytes accessed"],
            "update_stages_through_vmem": "S(1)" in update, "other_mesh_refused": refusal}


def weight_copies() -> dict:
    """The split kernels' planned HBM bytes of a bfloat16 `tiny` decoder at GA 2, with and
    without `cast_once_per_step`, and how many parameter elements the copies hold."""
    devices = target.topology_devices(target.TPU7X)
    out = {}
    for once in (True, False):
        engine = make_engine(ga=2, mesh="fsdp=1", paths=("split",), cast_once_per_step=once,
                             model_overrides=dict(dtype="bfloat16", scan_layers=True))
        tpu_mesh = target.mesh_like(engine.mesh, devices)
        out[str(once).lower()] = {
            name: counts.hbm_bytes(target.compile_plan(kernel.lower_for(tpu_mesh)).as_text())
            for name, kernel in engine.kernels.items()}
        if once:
            casts = precast.compute_dtypes(engine.params)
            out["copied_elements"] = sum(p.size for p, d in zip(
                jax.tree.leaves(engine.params), casts, strict=True) if d is not None)
    return out


if __name__ == "__main__":
    for mesh in sys.argv[1:]:
        print(json.dumps(weight_copies() if mesh == "copies" else plan(mesh)), flush=True)
