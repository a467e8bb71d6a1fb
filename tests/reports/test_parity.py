"""Gradient parity as a verdict: PASS / FAIL / None, and the known cause read from the record."""

import dataclasses

import pytest

from reports.parity import (
    BF16_TIED_HEAD,
    FAIL,
    GRAD_TOLERANCE,
    MEAN_OF_MEANS,
    PASS,
    parity_verdict,
)
from reports.record import codec
from tests.reports.helpers import fixture_records


def _cell(arm, ga, denominators, rel_l2, tied_head=None):
    """A fixture record recast as `arm` at `ga` with these micro-batch denominators."""
    record = fixture_records(("engine",))[0]
    spec = dataclasses.replace(record.spec, ga=ga)
    parity = dataclasses.replace(record.parity, denominators=list(denominators),
                                 denominator=float(sum(denominators)), rel_l2=rel_l2,
                                 tied_head=tied_head)
    return dataclasses.replace(record, arm=arm, spec=spec, parity=parity)


def test_the_fixture_passes_exact_arms_and_fails_peft_at_ragged_ga2_with_the_cause():
    verdicts = {(r.arm, r.spec.seq, r.spec.ga): parity_verdict(r) for r in fixture_records()}
    assert verdicts[("engine", 16, 2)].status == PASS
    assert verdicts[("peft-decoder", 16, 1)].status == PASS
    failed = verdicts[("peft-decoder", 16, 2)]
    assert failed.status == FAIL and not failed.passed
    assert failed.causes == (MEAN_OF_MEANS,)
    assert failed.text() == ("FAIL (rel_l2 5.98e-01 > 1e-05: mean of micro-batch means "
                             "(optax.MultiSteps))")
    assert verdicts[("test-raise", 16, 1)] is None  # a failed cell checked no parity


def test_pass_and_fail_turn_on_the_tolerance():
    assert parity_verdict(_cell("engine", 1, [64], GRAD_TOLERANCE)).status == PASS
    assert parity_verdict(_cell("engine", 1, [64], GRAD_TOLERANCE * 1.01)).status == FAIL
    # bfloat16 work is held to its floor (the reference against itself in float32)
    bf16 = _cell("engine", 1, [64], 7.5e-3)
    assert not parity_verdict(bf16).passed  # no floor recorded: the float32 tolerance
    bf16.parity.floor_rel_l2 = 2.57e-2
    assert parity_verdict(bf16).passed and parity_verdict(bf16).tolerance == 2.57e-2
    bf16.parity.rel_l2 = 2.6e-2
    assert parity_verdict(bf16).text() == "FAIL (rel_l2 2.60e-02 > 0.0257: cause unknown)"
    bf16.parity.floor_rel_l2 = 1e-9  # never below the float32 tolerance
    bf16.parity.rel_l2 = GRAD_TOLERANCE
    assert parity_verdict(bf16).passed and parity_verdict(bf16).tolerance == GRAD_TOLERANCE
    passed = parity_verdict(_cell("engine", 1, [64], 1.79e-6))
    assert passed.text() == "PASS (rel_l2 1.79e-06 <= 1e-05)" and passed.causes == ()


def test_a_record_without_parity_has_no_verdict():
    record = dataclasses.replace(fixture_records(("engine",))[0], parity=None)
    assert parity_verdict(record) is None


@pytest.mark.parametrize("rel_l2", [float("nan"), float("inf")])
def test_a_non_finite_gradient_fails(rel_l2):
    verdict = parity_verdict(_cell("engine", 1, [64], rel_l2))
    assert verdict.status == FAIL and verdict.rel_l2 is None
    assert "rel_l2 not finite > 1e-05" in verdict.text()


def test_an_untied_maxtext_fail_is_not_blamed_on_the_tied_head():
    untied = parity_verdict(_cell("peft-maxtext", 4, [96, 32, 80, 16], 0.83, tied_head=False))
    assert untied.causes == (MEAN_OF_MEANS,)
    assert parity_verdict(_cell("maxtext-engine", 1, [64], 0.83, tied_head=False)).causes == ()
    tied = parity_verdict(_cell("maxtext-engine", 1, [64], 0.83, tied_head=True))
    assert tied.causes == (BF16_TIED_HEAD,)


@pytest.mark.parametrize(("arm", "ga", "denominators", "causes"), [
    # PeftTrainer at GA > 1 with ragged loss tokens: MultiSteps' mean of means.
    ("peft-decoder", 4, [96, 32, 80, 16], (MEAN_OF_MEANS,)),
    ("peft-tunix", 2, [24, 8], (MEAN_OF_MEANS,)),
    ("peft:maxtext", 2, [24, 8], (MEAN_OF_MEANS, BF16_TIED_HEAD)),
    ("peft-maxtext", 4, [96, 32, 80, 16], (MEAN_OF_MEANS, BF16_TIED_HEAD)),
    # Equal denominators: a mean of means is sum/sum, so that is not why it failed.
    ("peft-decoder", 4, [32, 32, 32, 32], ()),
    # GA 1 has no micro-batch mean to average.
    ("peft-decoder", 1, [64], ()),
    # An exact trainer with the same ragged batches has no known excuse.
    ("engine", 4, [96, 32, 80, 16], ()),
    ("native", 2, [24, 8], ()),
    # MaxText's Qwen3 under any trainer reads a tied head in bfloat16.
    ("maxtext-engine", 1, [64], (BF16_TIED_HEAD,)),
    ("engine:maxtext", 4, [96, 32, 80, 16], (BF16_TIED_HEAD,)),
])
def test_a_fail_names_the_cause_the_record_shows(arm, ga, denominators, causes):
    verdict = parity_verdict(_cell(arm, ga, denominators, 0.83))
    assert verdict.status == FAIL
    assert verdict.causes == causes
    assert verdict.cause == ("; ".join(causes) or "cause unknown")


def test_a_pass_names_no_cause_even_where_one_could_apply():
    # A PeftTrainer arm at ragged GA 4 whose gradient is exact: nothing to explain.
    verdict = parity_verdict(_cell("peft-decoder", 4, [96, 32, 80, 16], 1e-6))
    assert verdict.passed and verdict.causes == () and verdict.cause == ""


def test_a_nan_gradient_written_to_a_results_file_reads_back_as_a_fail(tmp_path):
    record = _cell("engine", 1, [64], float("nan"))
    record = dataclasses.replace(record, parity=dataclasses.replace(
        record.parity, grad_l2=float("nan")))
    line = codec.encode_line(record)  # JSON has no NaN: stored as null
    assert b"NaN" not in line and line.endswith(b"\n") and line.count(b"\n") == 1
    (tmp_path / "r.jsonl").write_bytes(line)
    (back,) = codec.read(tmp_path / "r.jsonl")
    assert back.parity.rel_l2 is None and back.parity.grad_l2 is None
    assert parity_verdict(back).text() == "FAIL (rel_l2 not finite > 1e-05: cause unknown)"
