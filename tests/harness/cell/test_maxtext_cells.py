"""The MaxText arms as a cell runs them, on either supported stack (the lock's Python 3.12 /
jax 0.11.2, and the TPU v5e host's Python 3.11 / jax 0.10.2, where maxtext 0.2.5 runs through
arms.models.maxtext_compat): the exact gradient at tiny-untied, and every program compiled
once per cell (the fit check's compile is what the build loads)."""

import pytest

from harness.cli.console import compiled_twice
from harness.grid.expand import expand
from harness.jobs.run import run_grid
from reports.parity import GRAD_TOLERANCE
from tests.harness.cli_helpers import cli_env
from tests.harness.orchestrator.test_loop import TINY

pytestmark = pytest.mark.maxtext  # builds the real MaxText


# Two MaxText cells (~35 s): on Python 3.12 `make parity` runs both arms' cells and checks
# their gradients (the cpu-default suite); `make test-py311` runs this on the host's stack.
@pytest.mark.slow
@pytest.mark.py311
def test_the_maxtext_arms_pass_parity_and_compile_each_program_once(tmp_path):
    cells = expand({**TINY, "preset": "tiny-untied", "seq": 32, "batch": 4, "steps": 3,
                    "arms": ["peft-maxtext", "maxtext-engine"], "ga": [1], "remat": "full",
                    "fit_bytes": 2**30})
    _, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=600)
    assert [r.arm for r in records] == ["peft-maxtext", "maxtext-engine"]
    for record in records:
        assert record.ok, record.error
        assert record.parity.rel_l2 <= GRAD_TOLERANCE, (record.arm, record.parity.rel_l2)
        log = record.timing.compile_log
        assert compiled_twice(log) == [], record.arm
        fitted = [e["program"] for e in log if e["phase"] == "fit"]
        assert fitted and all(not e["cached"] for e in log if e["phase"] == "fit")
        built = [e for e in log if e["phase"] == "build" and e["program"] in fitted]
        assert built and all(e["cached"] for e in built), (record.arm, built)
