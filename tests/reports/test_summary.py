"""The summary: fastest arm per shape, speedups with CI and verdict, parity PASS / FAIL,
instability and failed cells."""

import dataclasses

from reports.frame import to_frame
from reports.summary import summary
from tests.reports.helpers import fixture_records, with_rounds


def _lines(text, prefix):
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _timing(text):
    """The summary's timing part (after the exact comparisons and gradient parity)."""
    return text[text.index("**Timing**"):]


def test_the_fixture_summary_leads_with_exact_figures_and_names_no_fastest_on_noise():
    text = summary(to_frame(fixture_records()), "peft-decoder")
    # Exact comparisons first, then gradient parity, then timing.
    exact, parity, timing = (text.index(h) for h in (
        "**Exact comparisons**", "**Gradient parity**", "**Timing**"))
    assert exact < parity < timing
    assert _lines(text, "| tiny s16 b4 ga1 float32 |")[0] == (
        "| tiny s16 b4 ga1 float32 | engine | - | 2 (2.00x) |")  # schema 1: unknown
    assert "|  | native | 2.2 MiB (0.97x) | 1 (1.00x) |" in text[exact:parity]
    assert ("|  | peft-decoder | **FAIL** 5.98e-01: mean of micro-batch means "
            "(optax.MultiSteps) |") in text[parity:timing]
    # Every timing here is too few rounds for a verdict: no arm is called the fastest.
    assert "(fastest)" not in text
    rows = _lines(text[timing:], "| tiny s16 b4 ga1 float32 |")
    assert rows == ["| tiny s16 b4 ga1 float32 | native | 2.1 | 1.35x [1.00, 3.19] | "
                    "too few samples |"]
    assert ("- tiny s16 b4 ga1 float32: no timing verdict (noise 218%: native vs "
            "peft-decoder 1.35x, too few samples)") in text
    assert "|  | peft-decoder | 4.4 | 1.00x (baseline) |  |" in text
    assert "Gradient parity: 10 PASS, 2 FAIL." in text
    assert ("tiny s16 b4 ga2 float32: the baseline peft-decoder fails gradient parity"
            in text)
    assert "Instability warnings (reports.stats): 12 of 12 cells" in text
    assert "**Failed cells: 4**" in text
    assert ("- tiny s32 b4 ga2 float32 test-raise: exception: RuntimeError: injected failure "
            "in step") in text


def test_program_calls_show_the_traced_executions_where_they_differ():
    # An arm that runs programs of its own beside the kernels it calls (MaxText's engine: 2
    # calls, 20 device executions at GA 1): the summary gives both, the calls' ratio as before.
    records = []
    for record in fixture_records():
        if record.ok and record.arm == "engine" and record.trace:
            trace = dataclasses.replace(record.trace, executions_per_step=[
                n + 18 for n in record.trace.executions_per_step])
            record = dataclasses.replace(record, trace=trace)
        records.append(record)
    exact = summary(to_frame(records), "native").split("**Gradient parity**")[0]
    assert "| program calls/step |" in exact
    assert "| tiny s16 b4 ga1 float32 | engine | - | 2 (2.00x) [20 in trace] |" in exact
    assert "|  | native | 2.2 MiB (1.00x) | 1 (1.00x) |" in exact  # equal counts: one figure
    assert exact.count(" in trace] |") == 4  # the four engine cells, nothing else


def _six_rounds(medians):
    """The s16 ga2 cells of the fixture, six interleaved rounds each at the given medians."""
    out = []
    for record in fixture_records():
        if record.ok and record.spec.seq == 16 and record.spec.ga == 2:
            out += with_rounds(record, medians[record.arm], seed=len(out))
    return out


def test_a_speedup_beyond_noise_is_called_faster_with_its_ci():
    text = summary(to_frame(_six_rounds({"engine": 5.0, "native": 2.0, "peft-decoder": 10.0})),
                   "engine")
    (fastest,) = _lines(_timing(text), "| tiny s16 b4 ga2 float32 |")
    cells = [c.strip() for c in fastest.strip("|").split("|")]
    assert cells[1] == "**native** (fastest)"
    assert ("- tiny s16 b4 ga2 float32: fastest **native** (native is faster than every "
            "other arm beyond noise)") in text
    ratio, low, high = (float(x) for x in
                        cells[3].replace("x", "").replace("[", "").replace("]", "")
                        .replace(",", "").split())
    assert 2.4 < low <= ratio <= high < 2.6
    assert cells[4] == "faster"
    assert "|  | native | PASS " in text[text.index("**Gradient parity**"):]
    assert "|  | engine | 5.0 | 1.00x (baseline) |" in text
    # peft-decoder fails parity: its time gets no verdict, only why it is not the same work.
    assert "| peft-decoder | 10.0 | 0.50x [" in text
    assert "| not comparable work (fails parity) |" in text
    assert "Failed cells: none." in text


def test_an_arm_failing_parity_is_never_the_fastest():
    text = summary(to_frame(_six_rounds({"engine": 5.0, "native": 4.0, "peft-decoder": 1.0})),
                   "native")
    rows = _lines(_timing(text), "| tiny s16 b4 ga2 float32 |")
    assert rows[0].startswith("| tiny s16 b4 ga2 float32 | peft-decoder | 1.0 |")
    assert "|  | **native** (fastest) | 4.0 | 1.00x (baseline) |" in text
    assert ("peft-decoder has a lower median (1.0 ms) than native but fails gradient parity"
            in text)


def test_a_lead_under_the_minimum_effect_is_no_fastest_arm():
    # native leads engine by 2% at 1% step noise: the CI excludes 1.00, but the lead is
    # under the CPU machine's 5% minimum effect: detected, not faster, so no arm is the
    # fastest; the rule under the table names the minimum effect and spread used.
    text = summary(to_frame(_six_rounds({"engine": 5.1, "native": 5.0, "peft-decoder": 10.0})),
                   "engine")
    assert "(fastest)" not in text
    assert ("- tiny s16 b4 ga2 float32: no timing verdict (noise " in text
            and "native vs engine 1.02x, detected, under the 5% minimum effect)" in text)
    assert ("Used here: minimum effect 5%, the CPU machine's from its A/A floor; process "
            "spread log-SD 0.25 a process (the CPU machine's, measured on a 2-core VM)"
            in text)
