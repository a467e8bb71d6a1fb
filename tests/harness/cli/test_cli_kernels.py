"""`parity kernels` on CPU: behaviour, not timings (the kernels run in Pallas interpret mode,
where a time means nothing). Float32, so each variant's values are held to the kernels'
float32 tolerances (tests/engine/model/test_attention.py, test_head.py): the command
measures the variants it names, not something else (each differs from the plain one by
round-off, never by nothing)."""

import json
import math

import pytest

from harness.cli import main

F32_ATTENTION = 4 * math.sqrt(16 + 256) * 2.0**-23  # head dim 16, 256 keys
F32_LOSS = 8 * 2.0**-23


def test_kernels_times_every_variant_at_every_shape_plain_first(capsys):
    code = main(["kernels", "--preset", "tiny", "--dtype", "f32", "--shapes", "1x256,2x128",
                 "--attention", "splash:128x128,flash:128x128", "--logits-chunks", "64",
                 "--steps", "1", "--warmup", "0", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["preset"], out["dtype"], out["platform"], out["interpret"]) == (
        "tiny", "float32", "cpu", True)
    found = [(t["part"], t["shape"], t["variant"]) for t in out["timings"]]
    assert found == [(part, shape, variant) for shape in ("1x256", "2x128")
                     for part, variant in (("attention", "xla"), ("attention", "splash:128x128"),
                                           ("attention", "flash:128x128"), ("loss", "whole"),
                                           ("loss", "chunk:64"))]
    for t in out["timings"]:
        assert t["steps"] == 1 and 0 < t["min_ms"] <= t["median_ms"] <= t["max_ms"]
        assert t["temp_bytes"] > 0
        assert t["rel_l2"] <= (F32_ATTENTION if t["part"] == "attention" else F32_LOSS)
        if t["variant"] in ("xla", "whole"):
            assert t["rel_l2"] == 0.0
        else:  # its own arithmetic (sums in another order): float32 round-off, not zero
            assert t["rel_l2"] > 0.0
    assert len(out["fastest"]) == 4  # one line per part and shape


def test_kernels_prints_a_table_and_can_skip_a_part(capsys):
    assert main(["kernels", "--preset", "tiny", "--shapes", "1x128", "--no-attention",
                 "--logits-chunks", "0,32", "--steps", "1", "--warmup", "0"]) == 0
    out = capsys.readouterr().out
    assert "kernels in Pallas interpret mode, times mean nothing" in out
    assert "| loss | 1x128 | whole |" in out and "| loss | 1x128 | chunk:32 |" in out
    assert "| attention |" not in out


def test_a_variant_that_does_not_tile_a_shape_is_skipped_there_and_said(capsys):
    """A 256-key block and a 256-position chunk run at 256 positions and are skipped at 128,
    each skip in the output with the tiling rule's words; the rest runs."""
    code = main(["kernels", "--preset", "tiny", "--dtype", "f32", "--shapes", "1x128,1x256",
                 "--attention", "splash:128x256", "--logits-chunks", "0,256", "--steps", "1",
                 "--warmup", "0", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    found = [(t["part"], t["shape"], t["variant"]) for t in out["timings"]]
    assert found == [("attention", "1x128", "xla"), ("loss", "1x128", "whole"),
                     ("attention", "1x256", "xla"), ("attention", "1x256", "splash:128x256"),
                     ("loss", "1x256", "whole"), ("loss", "1x256", "chunk:256")]
    skipped = [(s["part"], s["shape"], s["variant"]) for s in out["skipped"]]
    assert skipped == [("attention", "1x128", "splash:128x256"), ("loss", "1x128", "chunk:256")]
    assert "attention_block_kv=256 does not divide seq 128" in out["skipped"][0]["why"]
    assert "logits_chunk=256 does not divide seq 128" in out["skipped"][1]["why"]


def test_the_defaults_run_at_the_v5e_suites_shapes():
    """`parity kernels` with no options: every default variant and chunk tiles 1x4096; the
    2048-key blocks and nothing else are skipped at 2x1024 (planned, nothing compiled)."""
    import argparse

    from harness.cli.kernels import Kernels
    from harness.measure import kernels

    parser = argparse.ArgumentParser()
    Kernels.setup(parser)
    args = parser.parse_args([])
    shapes = kernels.parse_shapes(args.shapes)
    assert [s.label for s in shapes] == ["2x1024", "1x4096"]
    variants = kernels.parse_variants(args.attention)
    runs, skipped = kernels.plan(shapes, variants, kernels.parse_chunks(args.logits_chunks))
    assert runs["1x4096"] == (variants, [0, 256, 512, 1024])
    assert [(s.shape, s.variant) for s in skipped] == [
        ("2x1024", "splash:512x2048"), ("2x1024", "splash:1024x2048")]
    assert runs["2x1024"][0] == [v for v in variants if v.block_kv != 2048]


@pytest.mark.parametrize(("argv", "message"), [
    (["--attention", "splash:100x128"], "attention_block_q=100: the splash attention kernel's "
                                        "blocks are multiples of 128"),
    (["--attention", "flash:128x512"], "attention_block_kv=512 does not divide seq 256"),
    (["--attention", "splash"], "give xla, splash:QxKV or flash:QxKV"),
    (["--no-attention", "--logits-chunks", "100"], "logits_chunk=100 does not divide seq 256"),
    (["--shapes", "2by256"], "give BATCHxSEQ with positive numbers"),
    (["--steps", "0"], "give at least 1 timed step"),
])
def test_bad_input_is_one_line_naming_the_fix_and_exit_2(capsys, argv, message):
    assert main(["kernels", "--preset", "tiny", "--shapes", "1x256", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
