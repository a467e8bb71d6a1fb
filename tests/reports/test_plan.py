"""The report's roofline table: each plan's lower bound, what bounds it, its MFU ceiling,
and the same cell measured on the plan's device kind beside it (reports.plan)."""

import dataclasses

from reports.frame import to_frame
from reports.plan import roofline_table
from tests.reports.site import synthetic


def _cells():
    records = synthetic.nightly_history(nights=1, arms=("native",), presets=("qwen3-8b",),
                                        gas=(1,), planted=[])
    (plan,) = [r for r in records if r.plan]
    # one cell: a plan and the same work measured on TPU7x share the cell's config hash
    timed = [dataclasses.replace(r, config_hash=plan.config_hash) for r in records if r.timing]
    return plan, timed


def _row(text: str) -> list[str]:
    (line,) = [line for line in text.splitlines() if "| native |" in line]
    return [c.strip() for c in line.split("|")[1:-1]]


def test_the_roofline_table_puts_the_measured_step_beside_the_bound():
    plan, timed = _cells()
    roof = plan.plan.roofline
    bound_ms = roof.step.lower_bound_s * 1e3
    measured = to_frame([plan, *timed])
    text = roofline_table(to_frame([plan]), measured)
    cells = _row(text)
    assert cells[5] == f"**{bound_ms:.2f}**" and cells[6] == roof.step.bound_by
    assert cells[8] == f"{roof.mfu_ceiling:.1%}"
    median = measured[measured["plan_target"].isna()]["median_ms"].iloc[0]
    assert cells[9] == f"{median:.2f}" and cells[10] == f"{median / bound_ms:.2f}x"


def test_without_a_run_on_the_device_kind_nothing_is_set_beside_it():
    plan, timed = _cells()
    elsewhere = [dataclasses.replace(r, environment=dataclasses.replace(
        r.environment, device_kind="NVIDIA H200")) for r in timed]
    text = roofline_table(to_frame([plan]), to_frame([plan, *elsewhere]))
    assert len(_row(text)) == 9
    assert "Not shown, no value in any row: measured ms/step (no record of these cells run " \
           "on the target's device kind" in text


def test_each_row_names_our_decoders_options_where_an_arm_ran_other_than_the_defaults():
    """The tpu-v5e plans at seq 4096 GA 4 (docs/results/tpu-v5e): each arm once with splash
    attention and the chunked loss, once with the chunk alone. One shape, so the rows read
    apart only by the options their arm label carries."""
    from pathlib import Path

    from reports.plan import table
    from reports.record import codec

    path = (Path(__file__).resolve().parents[2] / "docs" / "results" / "tpu-v5e"
            / "plan-s4096-ga4-options.jsonl")
    text = table(to_frame(codec.read(path)), "peft-decoder")
    labels = [line.split("|")[2].strip() for line in text.splitlines()
              if line.startswith("|") and "| engine (" in line]
    assert labels == ["engine (attention=splash/512x1024 logits_chunk=512)",
                      "engine (logits_chunk=512)"]
