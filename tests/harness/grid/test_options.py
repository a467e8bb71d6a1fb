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
