import pytest

from engine.model import PRESETS, DecoderConfig, get_preset, param_count


def test_presets_are_all_listed_in_unknown_preset_error():
    with pytest.raises(ValueError, match="unknown model preset 'qwen3-9b'") as err:
        get_preset("qwen3-9b")
    for name in PRESETS:
        assert name in str(err.value)


def test_heads_not_divisible_by_kv_heads_names_the_fix():
    with pytest.raises(ValueError, match="num_heads=6 is not divisible by num_kv_heads=4"):
        DecoderConfig(vocab_size=8, embed_dim=8, num_layers=1, num_heads=6, num_kv_heads=4,
                      head_dim=4, mlp_dim=8)


def test_tiny_is_under_a_million_params_and_small_is_bigger():
    tiny, small = param_count(get_preset("tiny")), param_count(get_preset("small"))
    assert tiny < 1_000_000
    assert small > 10 * tiny


def test_untied_head_adds_exactly_one_embed_by_vocab_matrix():
    tied = get_preset("tiny")
    untied = tied.replace(tie_embeddings=False)
    assert param_count(untied) - param_count(tied) == tied.embed_dim * tied.vocab_size


@pytest.mark.parametrize("tied_name", ["tiny", "small"])
def test_each_untied_preset_is_its_tied_preset_with_a_separate_head(tied_name):
    """`X-untied` is `X` plus an output head and nothing else, so a MaxText arm's exact
    comparison on it measures the same model as `X` up to that one matrix."""
    tied, untied = get_preset(tied_name), get_preset(f"{tied_name}-untied")
    assert tied.tie_embeddings and not untied.tie_embeddings
    assert untied == tied.replace(tie_embeddings=False)


def test_override_applies_and_bad_remat_is_refused():
    assert get_preset("tiny", scan_layers=True).scan_layers
    with pytest.raises(ValueError, match="remat='some'"):
        get_preset("tiny", remat="some")
