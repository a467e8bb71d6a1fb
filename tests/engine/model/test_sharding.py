import jax
import numpy as np
import pytest
from flax import nnx

from arms.workload import TokenCrossEntropy, make_micro_batches, rel_l2
from engine.model import (
    batch_sharding,
    build_decoder,
    check_fits,
    get_preset,
    make_mesh,
    parse_mesh_spec,
    sharding_context,
)

LOSS = TokenCrossEntropy()


def _loss_and_grad_fn(graph):
    # A fresh closure per call: JAX's trace cache ignores flax's logical-axis rules.
    def f(params, batch):
        return jax.value_and_grad(lambda p: LOSS(nnx.merge(graph, p), batch).loss_sum)(params)
    return f


def _run(mesh_spec, config, batch):
    mesh = make_mesh(mesh_spec)
    model = build_decoder(config, seed=0, mesh=mesh)
    graph, params = nnx.split(model)
    batch = jax.device_put(batch, batch_sharding(mesh))
    with sharding_context(mesh):
        value, grads = jax.jit(_loss_and_grad_fn(graph))(params, batch)
    return float(value), grads


@pytest.mark.parametrize(("scan", "mesh_spec"), [
    (False, "fsdp=8"), (True, "fsdp=4,tensor=2"),  # each value of each once; the rest slow
    pytest.param(True, "fsdp=8", marks=pytest.mark.slow),
    pytest.param(False, "fsdp=4,tensor=2", marks=pytest.mark.slow)])
def test_sharded_loss_and_gradient_equal_one_device(devices, mesh_spec, scan):
    config = get_preset("tiny", scan_layers=scan)
    batch = make_micro_batches(seed=1, batch_size=8, seq_len=32, vocab_size=config.vocab_size,
                               mask_fraction=0.5)[0]
    v1, g1 = _run(None, config, batch)
    v8, g8 = _run(mesh_spec, config, batch)
    assert abs(v8 - v1) / abs(v1) <= 1e-5
    assert rel_l2(g8, g1) <= 1e-5


def _lowered_text(mesh, config, inside_rules: bool) -> str:
    model = build_decoder(config, seed=0, mesh=mesh)
    graph, params = nnx.split(model)
    batch = make_micro_batches(seed=1, batch_size=8, seq_len=16,
                               vocab_size=config.vocab_size)[0]
    f = jax.jit(_loss_and_grad_fn(graph))  # fresh function per lowering
    if inside_rules:
        with sharding_context(mesh):
            return f.lower(params, batch).as_text()
    with jax.set_mesh(mesh):
        return f.lower(params, batch).as_text()


def test_hlo_carries_activation_constraints_only_when_traced_inside_the_rules(devices):
    config, mesh = get_preset("tiny"), make_mesh("fsdp=4,tensor=2")
    inside = _lowered_text(mesh, config, inside_rules=True)
    outside = _lowered_text(mesh, config, inside_rules=False)
    assert inside.count("sharding_constraint") >= 2 * config.num_layers
    assert "sharding_constraint" not in outside


def test_more_tensor_shards_than_kv_heads_is_refused_before_compile(devices):
    with pytest.raises(ValueError, match=r"tensor=4 cannot split num_kv_heads=2 \(more tensor"):
        check_fits(get_preset("tiny"), make_mesh("tensor=4"))


def test_batch_not_divisible_by_batch_axes_names_the_fix(devices):
    with pytest.raises(ValueError, match="micro-batch size 6 is not divisible by the mesh's "
                                         r"batch axes \(data x fsdp = 4\)"):
        check_fits(get_preset("tiny"), make_mesh("data=2,fsdp=2"), batch_size=6)


def test_mesh_spec_errors_name_valid_axes_and_device_count(devices):
    with pytest.raises(ValueError, match=r"unknown mesh axis 'model'.*data, fsdp, tensor"):
        parse_mesh_spec("model=2")
    with pytest.raises(ValueError, match="needs 16 devices but 8 are available"):
        make_mesh("fsdp=16")
    assert dict(make_mesh("fsdp=4,tensor=2").shape) == {"data": 1, "fsdp": 4, "tensor": 2}


def test_a_minus_one_mesh_axis_takes_every_remaining_device(devices):
    assert parse_mesh_spec("fsdp=-1", 8) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert parse_mesh_spec("tensor=2,fsdp=-1", 8) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert parse_mesh_spec("fsdp=-1")["fsdp"] == -1  # unresolved without a device count
    assert dict(make_mesh("fsdp=-1").shape) == {"data": 1, "fsdp": 8, "tensor": 1}
    with pytest.raises(ValueError, match=r"the other axes \(3 devices\) do not divide the 8"):
        parse_mesh_spec("data=3,fsdp=-1", 8)
    with pytest.raises(ValueError, match="at most one axis can take all remaining devices"):
        parse_mesh_spec("data=-1,fsdp=-1", 8)
    with pytest.raises(ValueError, match="must be >= 1, or -1"):
        parse_mesh_spec("fsdp=-2", 8)


def test_the_tpu_suite_spans_a_slice_of_any_size():
    from harness.grid.expand import expand
    from harness.grid.options import load_suite

    suite = load_suite("tpu7x-nightly")
    assert suite["mesh"] == "fsdp=-1"
    for chips in (8, 16, 32):  # GA 1: 32 rows per micro-batch, split over up to 32 chips
        cells = expand({**suite, "ga": [1]}, mesh_sizes={"device_count": chips,
                                                         "backend": "tpu"})
        assert {c.spec["mesh"] for c in cells} == {"fsdp=-1"}
    with pytest.raises(ValueError, match="micro-batch size 8 is not divisible"):
        expand(suite, mesh_sizes={"device_count": 16, "backend": "tpu"})  # GA 4: 8 rows


def test_build_decoder_places_params_per_logical_rules(devices):
    model = build_decoder(get_preset("tiny"), mesh=make_mesh("fsdp=4,tensor=2"))
    spec = model.layers[0].mlp.wi_0[...].sharding.spec
    assert tuple(spec) == ("fsdp", "tensor")  # (embed, mlp) -> (fsdp, tensor)
    emb = model.embedding[...]
    assert tuple(emb.sharding.spec) == ("tensor", "fsdp")
    # Same draws as the unsharded build; jit may round the scale multiply differently.
    np.testing.assert_allclose(np.asarray(emb), np.asarray(build_decoder(
        get_preset("tiny")).embedding[...]), rtol=1e-6)
