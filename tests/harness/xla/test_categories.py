"""One category per HLO instruction (harness.xla.categories): programs compiled for the
conftest's 8 CPU devices, split by category, add up to their whole count, and what the
mapping cannot name it names by opcode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from harness.xla import categories, counts
from harness.xla.hlo import parse

K, LAYERS = 128, 4


def _sharded_scan() -> str:
    """Weights sharded over 8 devices and gathered per layer of a scan, a matmul and an
    elementwise op per layer, every layer's output written into a stacked buffer, and a
    sort (an op the mapping has no name for)."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    rows = NamedSharding(mesh, P(None, "fsdp", None))
    whole = NamedSharding(mesh, P())

    def step(x, w_LxKxK):
        def layer(h, w):
            h = jnp.tanh(h @ jax.lax.with_sharding_constraint(w, whole))
            return h, h
        h, stacked = jax.lax.scan(layer, x, w_LxKxK)
        return jnp.sort(h, axis=-1), stacked

    x = jax.ShapeDtypeStruct((K, K), jnp.float32, sharding=whole)
    w = jax.ShapeDtypeStruct((LAYERS, K, K), jnp.float32, sharding=rows)
    return jax.jit(step).lower(x, w).compile().as_text()


def test_the_categories_of_a_program_add_up_to_its_whole_count():
    text = _sharded_scan()
    split = categories.by_category(text)
    whole = counts.costs(text)
    rel = 1e-12  # float sums of the same terms in another order
    assert sum(t.hbm_bytes for t in split.values()) == pytest.approx(whole.hbm_bytes, rel=rel)
    assert sum(t.flops for t in split.values()) == pytest.approx(whole.flops, rel=rel)
    assert sum(t.collective_bytes for t in split.values()) == pytest.approx(
        sum(whole.collective_bytes.values()), rel=rel)
    # every FLOP is a matmul's: LAYERS runs of a K x K x K product
    assert split[categories.MATMUL].flops == whole.flops == LAYERS * 2 * K**3
    assert split[categories.MATMUL].count == LAYERS
    assert split["collective: all-gather"].collective_bytes > 0
    assert split["other: sort"].count == 1  # named by its opcode, not dropped
    assert list(split) == sorted(split, key=lambda c: -split[c].hbm_bytes)


def test_every_instruction_of_a_program_has_exactly_one_named_category():
    module = parse(_sharded_scan())
    found = {categories.category(e.instruction, module) for e in counts.entries(module)}
    assert categories.CONTROL in found and categories.NO_DATA in found
    assert all(c and not c.endswith(": ") for c in found)


@pytest.mark.parametrize(("name", "expected"), [
    ("all-gather-start.3", "collective: all-gather"),
    ("reduce-scatter.1", "collective: reduce-scatter"),
    ("collective-permute-done", "collective: collective-permute"),
    ("copy.4", categories.COPY),
    ("copy-start.12", categories.COPY),
    ("dynamic-update-slice.7", categories.UPDATE),
    ("dot.2", categories.MATMUL),
    ("fusion.12", "fusion: unknown kind"),
    ("while.1", categories.CONTROL),
    ("send-done.2", categories.HOST),
    ("add.3", "other: add"),
    ("Thunk:#1", "other: Thunk:#1"),
    # fusions XLA names after what they hold, the kind first where it names one
    ("loop_multiply_fusion", "fusion: loop"),
    ("input_reduce_fusion.2", "fusion: input"),
    ("multiply_bitcast_fusion.8", "fusion: unknown kind"),
    ("dot_bitcast_fusion.1", categories.MATMUL),
    ("ynn_fusion.54", "fusion: ynn"),  # XLA:CPU's fusions run by YNNPACK
    # XLA:CPU's fusion of a single instruction is that instruction
    ("wrapped_copy.3", categories.COPY),
    ("wrapped_scatter", "other: scatter"),
    # JAX's name for a conditional (lax.cond)
    ("cond.102", categories.CONTROL),
    # an unknown name less its number, so its runs share one category
    ("rng-bit-generator.4", "other: rng-bit-generator"),
])
def test_a_trace_op_is_named_by_the_opcode_its_name_begins_with(name, expected):
    assert categories.category_of_name(name) == expected


def test_a_trace_op_of_a_program_with_its_hlo_is_its_instructions_category():
    module = parse(_sharded_scan())
    fusions = [i for c in module.computations.values() for i in c if i.opcode == "fusion"]
    named = {categories.category_of_name(i.name, module) for i in fusions}
    assert categories.MATMUL in named or any(n.startswith("fusion: ") for n in named)
    assert all(n == categories.category(i, module) for n, i in
               zip([categories.category_of_name(i.name, module) for i in fusions], fusions,
                   strict=True))
