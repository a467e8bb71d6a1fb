"""The shipped suites pass every check made before a cell runs (harness.grid)."""

import pytest

from harness.grid import suites
from harness.grid.expand import expand
from harness.grid.options import load_suite


@pytest.mark.parametrize("name", suites.names())
def test_every_shipped_suite_passes_the_checks_made_before_any_cell(name):
    """A suite an arm cannot express (a remat policy Tunix's or MaxText's Qwen3 lacks, a
    shape its mesh cannot divide) would be refused whole on the machine it is meant for."""
    suite = load_suite(name)
    cells = expand(suite, mesh_sizes={"device_count": 8, "backend": "tpu"})
    assert {c.arm for c in cells} == set(suite["arms"])
    assert len({c.spec["remat"] for c in cells}) == 1  # one remat policy for every arm


def test_rows_per_micro_batch_make_each_cells_batch_by_its_ga_and_seq():
    """`micro_batch` instead of `batch`: each cell's batch is its rows x its GA, and a table
    by seq gives each length its own rows (the most that fit a device differ with it)."""
    base = {"arms": ["native"], "preset": "tiny", "ga": [1, 4]}
    cells = expand({**base, "seq": [16, 32], "micro_batch": {"16": 2, "32": [1, 3]}})
    shapes = sorted((c.spec["seq"], c.spec["batch"], c.spec["ga"]) for c in cells)
    assert shapes == [(16, 2, 1), (16, 8, 4), (32, 1, 1), (32, 3, 1), (32, 4, 4),
                      (32, 12, 4)]
    with pytest.raises(ValueError, match="micro_batch gives rows for seq 16 but not for seq 32"):
        expand({**base, "seq": [16, 32], "micro_batch": {"16": 2}})
    by_ga = expand({**base, "seq": [16, 32],
                    "micro_batch": {"16": {"1": 2, "4": 1}, "32": {"1": 1, "4": []}}})
    assert sorted((c.spec["seq"], c.spec["batch"], c.spec["ga"]) for c in by_ga) == [
        (16, 2, 1), (16, 4, 4), (32, 1, 1)]  # no rows at seq 32, GA 4: no cell
    with pytest.raises(ValueError, match="micro_batch gives rows for ga 1 but not for ga 4"):
        expand({**base, "seq": 16, "micro_batch": {"16": {"1": 2}}})
    with pytest.raises(ValueError, match=r"--batch .* or --micro-batch .*, not both"):
        expand({**base, "seq": 16, "batch": 4, "micro_batch": 2})


def test_a_grid_whose_every_shape_has_no_rows_is_refused_naming_the_shape_and_the_fix():
    """A table entry of no rows is a shape nothing fits: asking for that shape alone names
    it and `--batch`, rather than running nothing."""
    base = {"arms": ["native"], "preset": "tiny"}
    table = {"16": {"1": 2, "4": 1}, "32": {"1": 1, "4": []}}
    with pytest.raises(ValueError, match=r"no rows at seq 32 GA 4 .*pass --batch"):
        expand({**base, "seq": 32, "ga": 4, "micro_batch": table})
    assert len(expand({**base, "seq": 32, "ga": [1, 4], "micro_batch": table})) == 1


def test_a_batch_given_replaces_the_suites_rows_per_micro_batch():
    from harness.grid.options import merge

    suite = load_suite("tpu-v5e")
    assert "micro_batch" in suite and "batch" not in suite
    given = merge({"batch": [8]}, suite="tpu-v5e")
    assert given["batch"] == [8] and "micro_batch" not in given
    rows = merge({"micro_batch": [1]}, suite="tpu-v5e")
    assert rows["micro_batch"] == [1]


def test_our_decoders_options_reach_every_cell_from_the_command_line_and_suites():
    """--attention, --attention-block-q/kv and --logits-chunk (or the same keys in a suite)
    become each cell's spec; a grid an arm cannot take is refused before anything runs."""
    from harness.cli import build_parser
    from harness.cli.grid_args import request
    from harness.grid.options import merge

    args = build_parser(only="run").parse_args(
        ["run", "--arms", "engine,native", "--preset", "tiny", "--seq", "256", "--attention",
         "splash", "--attention-block-q", "128", "--attention-block-kv", "256",
         "--logits-chunk", "64"])
    options = merge(request(args, out=None).explicit)
    cells = expand(options)
    assert {c.arm for c in cells} == {"engine", "native"}
    for cell in cells:
        assert {k: cell.spec[k] for k in ("attention", "attention_block_q",
                                           "attention_block_kv", "logits_chunk")} == {
            "attention": "splash", "attention_block_q": 128, "attention_block_kv": 256,
            "logits_chunk": 64}
    with pytest.raises(ValueError, match="--attention splash is our decoder's Pallas kernel"):
        expand({**options, "arms": ["engine", "peft-tunix"], "remat": "full"})


def test_the_scan_backward_reaches_the_cells_on_our_decoder_and_names_them():
    """--scan-backward unfilled: the arms on our decoder's cells carry it (their hash with
    it), the default leaves the spec as it was; Tunix's model, which runs no scan of ours,
    refuses it; the cell's name says it."""
    from harness.cli import build_parser
    from harness.cli.grid_args import request
    from harness.contract import cell_hash
    from harness.grid.options import merge
    from reports.record import Spec, cell_name, section

    def cells(*extra):
        args = build_parser(only="run").parse_args(
            ["run", "--arms", "engine,native", "--preset", "tiny", "--seq", "32",
             "--scan-layers", "--remat", "full", *extra])
        return expand(merge(request(args, out=None).explicit))

    plain, unfilled = cells(), cells("--scan-backward", "unfilled")
    assert all("scan_backward" not in c.spec for c in plain)
    assert {c.spec["scan_backward"] for c in unfilled} == {"unfilled"}
    assert {cell_hash(c.spec) for c in plain}.isdisjoint(cell_hash(c.spec) for c in unfilled)
    assert cell_name("engine", section(Spec, unfilled[0].spec)).endswith(
        "seq=32 batch=8 ga=1 scan_backward=unfilled")
    with pytest.raises(ValueError, match=r"--scan-backward unfilled is how our decoder's layer "
                                         r"scan is differentiated; .* use --scan-backward jax"):
        expand({"arms": ["peft-tunix"], "preset": "tiny", "seq": 32, "batch": 8,
                "scan_layers": True, "remat": "full", "scan_backward": "unfilled"})
    with pytest.raises(ValueError, match="give scan_layers=True and remat='full'"):
        cells("--remat", "minimal", "--scan-backward", "unfilled")


def test_a_suites_decoder_table_sets_our_decoders_options_by_shape_for_its_arms_only():
    """`decoder`: our decoder's options by seq, then GA. The arms on our decoder take them at
    the shapes named (the rest keep the defaults); MaxText's and Tunix's models compute their
    own attention and logits, so their cells keep the defaults; a value given for every cell
    (the command line's) wins over the table."""
    base = {"arms": ["engine", "peft-tunix"], "preset": "tiny", "seq": [32, 64], "ga": [1, 2],
            "batch": 4, "decoder": {"64": {"2": {"logits_chunk": 16}},
                                    "32": {"logits_chunk": 8}}}  # 32: at every GA

    def options(cells):
        return {(c.arm, c.spec["seq"], c.spec["ga"]): c.spec.get("logits_chunk", 0)
                for c in cells}

    assert options(expand(base)) == {
        ("engine", 32, 1): 8, ("engine", 32, 2): 8, ("engine", 64, 1): 0,
        ("engine", 64, 2): 16, ("peft-tunix", 32, 1): 0, ("peft-tunix", 32, 2): 0,
        ("peft-tunix", 64, 1): 0, ("peft-tunix", 64, 2): 0}
    assert {c.spec.get("logits_chunk", 0) for c in expand({**base, "logits_chunk": 0,
                                                           "arms": ["engine"]})} == {0}
    with pytest.raises(ValueError, match="logits"):  # given for every cell: Tunix's refused
        expand({**base, "logits_chunk": 16})
    with pytest.raises(ValueError, match=r"decoder table at seq 32 GA 1 gives .*'remat'"):
        expand({**base, "decoder": {"32": {"remat": "none"}}})
    with pytest.raises(ValueError, match="divide"):  # the table's options are checked too
        expand({**base, "decoder": {"64": {"2": {"logits_chunk": 24}}}})


def test_rows_per_micro_batch_may_differ_by_arm_and_an_arm_with_none_has_no_cell():
    """A table by arm at a shape: what fits one device differs by arm (the tpu-v5e suite at
    seq 4096 GA 4 fits only the arms on our decoder, with its chunked loss); an arm given no
    rows there has no cell, and an arm the table does not name is refused, not dropped."""
    base = {"arms": ["engine", "native", "peft-tunix"], "preset": "tiny", "seq": 32,
            "ga": [1, 2]}
    cells = expand({**base, "micro_batch": {"32": {"1": 2, "2": {
        "engine": [1, 2], "native": 2, "peft-tunix": []}}}})
    assert sorted((c.arm, c.spec["batch"], c.spec["ga"]) for c in cells) == [
        ("engine", 2, 1), ("engine", 2, 2), ("engine", 4, 2), ("native", 2, 1),
        ("native", 4, 2), ("peft-tunix", 2, 1)]
    with pytest.raises(ValueError, match="for arms engine, native but not for peft-tunix"):
        expand({**base, "micro_batch": {"32": {"1": 2, "2": {"engine": 1, "native": 1}}}})
    only = {**base, "arms": ["peft-tunix"], "ga": 2,
            "micro_batch": {"32": {"2": {"peft-tunix": []}}}}
    with pytest.raises(ValueError, match="no cell to run"):
        expand(only)
    assert expand(only, allow_empty=True) == []
