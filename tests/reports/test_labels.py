"""Every label a verdict prints says what was measured (reports.stats.verdict / label), with
the minimum effect and process spread of the runs it was decided on (stats.rule): checked
on synthetic samples with known answers, and on the TPU v5e's own records.

The chip's records (docs/results/tpu-v5e/h2h): native at qwen3-0.6b seq 1024 GA 4, three
interleaved processes of 20 steps, median 250.2 ms, CV about 0.1%. Scaling B's steps by 1.03
plants a 3% slowdown the chip resolves (its process spread is log-SD 0.00044, the prior 0.01);
judged at a 5% minimum effect it is detected but under the minimum, never "no detectable
difference" nor "too few samples".
"""

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pytest

from reports import stats
from reports.compare import compare_sets, markdown, regressions
from reports.record import read_dir

CHIP = Path(__file__).resolve().parents[2] / "docs" / "results" / "tpu-v5e" / "h2h"


def _runs(rng, scale=1.0, *, runs=6, steps=20, run_sd=0.001, step_sd=0.001):
    return [100 * scale * (1 + rng.normal(0, run_sd)) * (1 + rng.normal(0, step_sd, steps))
            for _ in range(runs)]


def _compare(scale, **kw):
    rng = np.random.default_rng(0)
    options = {k: kw.pop(k) for k in ("runs", "steps", "run_sd", "step_sd") if k in kw}
    return stats.compare(_runs(rng, **options), _runs(rng, scale, **options), **kw)


def test_each_label_says_what_was_measured():
    # 6 + 6 quiet runs: they can reach 95% (stats.luck_bound), so the CI decides.
    slower, faster = _compare(1.10), _compare(0.90)
    assert (stats.verdict(slower), stats.label(slower)) == (stats.SLOWER, "slower")
    assert (stats.verdict(faster), stats.label(faster)) == (stats.FASTER, "faster")
    # 3% beyond a 0.1% noise, under the CPU machine's 5% minimum effect: detected, under it.
    under = _compare(1.03)
    assert under.low > 1.0 and stats.verdict(under) == stats.UNDER
    assert stats.label(under) == "detected, under the 5% minimum effect"
    assert stats.describe(under) == (f"{under.ratio:.3f} [{under.low:.3f}, {under.high:.3f}]: "
                                     "detected, under the 5% minimum effect")
    # the same at a 1% minimum effect (a TPU's, or --threshold 0.01) is slower
    assert stats.verdict(_compare(1.03, min_effect=0.01)) == stats.SLOWER
    # identical code with enough runs: no difference, with the smallest it could detect
    same = _compare(1.0, run_sd=0.02, step_sd=0.02)
    assert stats.verdict(same) == stats.SAME and same.low < 1.0 < same.high
    assert stats.label(same) == f"no detectable difference (MDE {same.mde:.1%})"
    assert stats.label(same, mde=False) == "no detectable difference"
    # 2 + 2 runs cannot reach 95% by the CI, and 1.3x is inside the CPU's spread bound
    few = _compare(1.3, runs=2)
    assert not few.enough and few.low > 1.0  # the CI alone would have called it
    assert stats.verdict(few) == stats.TOO_FEW and stats.label(few) == "too few samples"
    # under MIN_STEPS steps a run: too few, however clear
    assert stats.verdict(_compare(3.0, steps=3)) == stats.TOO_FEW
    # no CI asked for, within the minimum effect: it says only that
    quick = _compare(1.03, full_ci=False)
    assert quick.low is None and stats.verdict(quick) == stats.WITHIN
    assert stats.label(quick) == "within the 5% minimum effect (CI not computed)"


def test_too_few_runs_still_detect_what_clears_the_process_spread():
    # 2 + 2 runs on a TPU: the TPU's spread bound (1.02x at 2 a side) is cleared by a 3%
    # shift with 0.1% noise: detected, under a 5% minimum effect; slower at the TPU's 1%.
    under = _compare(1.03, runs=2, backend="tpu", min_effect=0.05)
    assert not under.enough and stats.verdict(under) == stats.UNDER
    assert stats.verdict(_compare(1.03, runs=2, backend="tpu")) == stats.SLOWER
    # 1% inside the 1.02x bound: the samples cannot tell
    assert stats.verdict(_compare(1.01, runs=2, backend="tpu")) == stats.TOO_FEW


def test_the_minimum_effect_is_the_backends_unless_named():
    assert stats.default_min_effect("tpu") == stats.TPU_MIN_EFFECT == 0.01
    assert stats.default_min_effect("cpu") == stats.default_min_effect("gpu") == 0.05
    assert stats.default_min_effect(None) == stats.MIN_EFFECT == 0.05
    assert _compare(1.0, backend="tpu").min_effect == 0.01
    assert _compare(1.0, backend="cpu").min_effect == 0.05
    assert _compare(1.0, backend="tpu", min_effect=0.03).min_effect == 0.03
    assert stats.percent(0.05) == "5%" and stats.percent(0.015) == "1.5%"


def test_the_printed_rule_names_the_spread_and_minimum_effect_used():
    cpu, tpu = _compare(1.0, backend="cpu"), _compare(1.0, backend="tpu")
    assert stats.rule([cpu]) == ("minimum effect 5%, the CPU machine's from its A/A floor; "
                                 "process spread log-SD 0.25 a process (the CPU machine's, "
                                 "measured on a 2-core VM)")
    assert stats.rule([tpu]) == ("minimum effect 1%, a TPU's from its A/A floor; process "
                                 "spread log-SD 0.01 a process, a TPU's (0.00044 measured on "
                                 "one v5e chip)")
    named = _compare(1.0, backend="tpu", min_effect=0.05)
    assert stats.rule([named]).startswith("minimum effect 5%; process spread log-SD 0.01")
    busy = _compare(1.0, busy=True)
    assert "log-SD 0.5 a process: a run shared the machine" in stats.rule([busy])
    # runs that spread more than the prior: their own spread, said
    wild = stats.compare([[100.0] * 10, [200.0] * 10, [50.0] * 10],
                         [[100.0] * 10, [210.0] * 10, [48.0] * 10], backend="tpu")
    assert "the runs' own spread where wider (1 comparisons, up to log-SD 0." in stats.rule(
        [wild])
    assert stats.rule([]) == ""


@pytest.fixture(scope="module")
def chip_native(tmp_path_factory):
    """The v5e's native runs (A) and the same runs with every step 3% longer (B)."""
    root = tmp_path_factory.mktemp("chip")
    shutil.copy(CHIP / "chip-h2h-s1024-ga4.jsonl", root / "chip.jsonl")
    old = [r for r in read_dir(root) if r.arm == "native" and r.ok]
    new = [dataclasses.replace(r, run_id=f"{r.run_id}-slow", timing=dataclasses.replace(
        r.timing, step_ms=[x * 1.03 for x in r.timing.step_ms])) for r in old]
    return old, new


def test_a_3_percent_slowdown_on_the_chip_is_detected_under_a_5_percent_minimum_effect(
        chip_native):
    old, new = chip_native
    assert len(old) == 3 and {r.environment.backend for r in old} == {"tpu"}
    (row,) = compare_sets(old, new, min_effect=0.05)
    t = row.timing
    assert 1.029 < t.ratio < 1.031 and t.low > 1.0  # detected, well clear of 1.00
    assert not t.enough  # 3 + 3 runs: the CI alone cannot reach 95% ...
    assert row.verdict == stats.UNDER  # ... but it clears the TPU's spread bound
    assert row.verdict not in (stats.SAME, stats.TOO_FEW)
    assert row.label == "detected, under the 5% minimum effect"
    assert regressions([row]) == []  # under the minimum effect asked for: not a regression
    text = markdown([row], old_label="A", new_label="B")
    assert "| 3 / 3 |" in text and "| detected, under the 5% minimum effect |" in text
    assert f"| {t.ratio:.3f} [{t.low:.3f}, {t.high:.3f}] |" in text  # with its ratio and CI
    assert "0 of 1 cells differ in time beyond noise by at least the minimum effect, 1 by " \
        "less (detected, under it)" in text
    # the rule printed is the TPU's, never the CPU machine's
    assert ("Used for these runs: minimum effect 5%; process spread log-SD 0.01 a process, "
            "a TPU's (0.00044 measured on one v5e chip)") in text
    assert "2-core" not in text


def test_the_chip_s_3_percent_is_slower_at_the_tpu_s_own_minimum_effect(chip_native):
    old, new = chip_native
    (row,) = compare_sets(old, new)
    assert row.timing.min_effect == 0.01 and row.verdict == stats.SLOWER
    assert regressions([row]) == [f"{row.name}: slower, {row.timing.ratio:.3f}x "
                                  f"[{row.timing.low:.3f}, {row.timing.high:.3f}]"]
    assert "Used for these runs: minimum effect 1%, a TPU's from its A/A floor" in markdown(
        [row])
    # and identical chip runs are not: no detectable difference or too few, never slower
    (same,) = compare_sets(old, [dataclasses.replace(r, run_id=f"{r.run_id}-again")
                                 for r in old])
    assert same.verdict in (stats.SAME, stats.TOO_FEW) and same.timing.ratio == 1.0
