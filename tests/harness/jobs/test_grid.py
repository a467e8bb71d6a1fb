"""harness.jobs.grid: arms this environment cannot run, refused where named on the command
line and set aside (then recorded as not run here) where a suite or the default named them;
and `parity arms`."""

import pytest

from harness.jobs.grid import arm_table, set_aside_unavailable
from tests.arms.test_requirements import TPU_HOST
from tests.harness.cli_helpers import parity_cli


def test_an_arm_named_explicitly_that_cannot_run_is_refused_with_one_line():
    options = {"arms": ["native", "maxtext-engine"]}
    with pytest.raises(ValueError) as refused:
        set_aside_unavailable(options, named=["native", "maxtext-engine"], found=TPU_HOST)
    assert str(refused.value).startswith(
        "arm maxtext-engine cannot run in this environment: maxtext not installed (>=0.2.5 "
        "needed)")
    assert "\n" not in str(refused.value)


def test_arms_a_suite_named_that_cannot_run_are_set_aside_with_why():
    options = {"arms": ["engine", "peft-maxtext", "native", "maxtext-engine"], "seq": [16]}
    kept = set_aside_unavailable(options, found=TPU_HOST)
    assert kept["arms"] == ["engine", "native"] and kept["seq"] == [16]
    assert set(kept["unavailable"]) == {"peft-maxtext", "maxtext-engine"}
    assert kept["unavailable"]["peft-maxtext"] == "maxtext not installed (>=0.2.5 needed)"
    assert set_aside_unavailable(options) == options  # here (the lock): every arm runs
    with pytest.raises(ValueError, match="no arm of the grid can run in this environment"):
        set_aside_unavailable({"arms": ["maxtext-engine"]}, found=TPU_HOST)


def test_parity_arms_lists_every_arm_and_what_it_needs():
    assert "| maxtext-engine | MaxText's MaxTextTrainingEngine | the real MaxText Qwen3 " \
           "(maxtext) | no: maxtext not installed" in arm_table(TPU_HOST)
    done = parity_cli("arms")
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 7 and all(r.endswith("| yes |") or "| no: " in r for r in rows)
    assert "| native | one jitted step (the straightforward way) |" in done.stdout
