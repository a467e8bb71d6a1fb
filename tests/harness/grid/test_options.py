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
    """A table entry of no rows is a shape nothing fits (the tpu-v5e suite at seq 4096 GA 4):
    asking for that shape alone names it and `--batch`, rather than running nothing."""
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
