import jax
import numpy as np
import pytest
from flax import nnx
from tunix.models.qwen3 import model as tunix_qwen3

from arms.models.tunix_qwen3 import from_tunix, to_tunix, tunix_config
from arms.workload import forward, make_micro_batches, max_rel_error
from engine.model import Decoder, get_preset, param_count


def _randomize(model, seed):
    """Non-zero weights everywhere (Tunix zero-initializes its MLP; ones for norms)."""
    state = nnx.state(model, nnx.Param)
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(
        lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), state))


@pytest.mark.parametrize(("scan", "tie"), [
    (False, True), (True, False),  # each value of each once; the other pairs slow
    pytest.param(False, False, marks=pytest.mark.slow),
    pytest.param(True, True, marks=pytest.mark.slow)])
def test_same_weights_give_the_same_logits(tie, scan):
    config = get_preset("tiny", scan_layers=scan, tie_embeddings=tie)
    decoder = Decoder(config, rngs=nnx.Rngs(1))
    _randomize(decoder, 7)
    tunix_model = to_tunix(decoder)
    batch = make_micro_batches(seed=0, batch_size=2, seq_len=32, vocab_size=config.vocab_size,
                               segments_per_row=3)[0]
    assert max_rel_error(forward(tunix_model, batch), forward(decoder, batch)) <= 1e-5
    # Both MLP paths carry weight: zeroing Tunix's MLP changes its logits.
    assert np.abs(np.asarray(tunix_model.qwen3.layers[0].mlp.gate_proj.kernel[...])).min() > 0


@pytest.mark.parametrize("scan", [False, True])
def test_conversion_round_trips_bitwise(scan):
    config = get_preset("tiny", scan_layers=scan, tie_embeddings=False)
    decoder = Decoder(config, rngs=nnx.Rngs(2))
    back = from_tunix(to_tunix(decoder), config)
    for a, b in zip(jax.tree.leaves(nnx.state(back, nnx.Param)),
                    jax.tree.leaves(nnx.state(decoder, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize(("preset", "tunix_preset"), [
    ("qwen3-0.6b", tunix_qwen3.ModelConfig.qwen3_0p6b),
    ("qwen3-1.7b", tunix_qwen3.ModelConfig.qwen3_1p7b),
    ("qwen3-4b", tunix_qwen3.ModelConfig.qwen3_4b),
    ("qwen3-8b", tunix_qwen3.ModelConfig.qwen3_8b),
])
def test_real_preset_param_counts_equal_tunix(preset, tunix_preset):
    abstract = nnx.eval_shape(lambda: tunix_qwen3.Qwen3(tunix_preset(), rngs=nnx.Rngs(0)))
    theirs = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    assert param_count(get_preset(preset)) == theirs


def test_config_maps_every_dimension():
    c = get_preset("small")
    t = tunix_config(c)
    assert (t.num_layers, t.vocab_size, t.embed_dim, t.hidden_dim, t.num_heads, t.head_dim,
            t.num_kv_heads) == (c.num_layers, c.vocab_size, c.embed_dim, c.mlp_dim,
                                c.num_heads, c.head_dim, c.num_kv_heads)
    with pytest.raises(ValueError, match="theta=1e6"):
        tunix_config(c.replace(rope_theta=10_000.0))


def test_remat_full_is_tunix_decoder_remat_and_minimal_is_refused():
    """Our `full` recomputes every layer from its input; Tunix's DECODER remat does the same
    (nnx.remat of the whole layer, nothing saved). Without it, a Tunix arm would keep its
    activations while the others recompute them: other work (compiled/model FLOPs 1.04
    against 1.25 on `small-untied`)."""
    assert tunix_config(get_preset("tiny", remat="full")).remat_config == (
        tunix_qwen3.RematConfig.DECODER)
    assert tunix_config(get_preset("tiny")).remat_config == tunix_qwen3.RematConfig.NONE
    with pytest.raises(ValueError, match="remat='minimal' has no equivalent in Tunix's Qwen3"):
        tunix_config(get_preset("tiny", remat="minimal"))
