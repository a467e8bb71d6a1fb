"""harness.jobs.run: which cells start as forks of their arm's zygote."""

import pytest

from harness.jobs.run import prefork_on


def test_cells_fork_from_the_zygote_on_the_cpu_backend_only():
    assert prefork_on({"backend": "cpu", "device_count": 8})
    for accelerator in ("gpu", "cuda", "tpu"):
        assert not prefork_on({"backend": accelerator, "device_count": 1})


@pytest.mark.slow  # two rounds of cell processes and a report (~18 s)
def test_cells_not_run_here_are_recorded_once_each_and_the_report_says_why(tmp_path):
    """Cells of an arm this environment cannot run (set aside by harness.jobs.grid) are
    recorded once, without a process, as not run here, stamped like any record; the rest of
    the grid runs; the report lists them apart from the failed cells."""
    from harness.grid.expand import expand
    from harness.jobs.run import run_grid
    from tests.harness.cli_helpers import cli_env, parity_cli
    from tests.harness.orchestrator.test_loop import TINY

    cells = expand({**TINY, "arms": ["native", "maxtext-engine"], "ga": [1, 2],
                    "remat": "full", "parity": False})
    ran = [c for c in cells if c.arm == "native"]
    unrun = [(c, "jax 0.10.2 found, >=0.11.2 needed") for c in cells if c.arm != "native"]
    _, records = run_grid(ran, tmp_path, env=cli_env(), timeout_s=300, rounds=2, unrun=unrun)
    skipped = [r for r in records if not r.ok]
    assert len(records) == 6 and len(skipped) == 2  # native x 2 shapes x 2 rounds; 2 once
    for record in skipped:
        assert record.unavailable and record.arm == "maxtext-engine"
        assert record.error.message == "not run here: jax 0.10.2 found, >=0.11.2 needed"
        assert record.spec.ga in (1, 2) and record.round == 0 and record.timing is None
    done = parity_cli("report", str(tmp_path), "-o", str(tmp_path / "parity.md"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "parity.md").read_text()
    assert "Failed cells: none." in text
    assert ("**Not run here** (their packages cannot run in this environment; `parity arms` "
            "lists what each needs): maxtext-engine (jax 0.10.2 found, >=0.11.2 needed).") in text
