"""The detailed tables: columns with no value anywhere are dropped, shapes are written once."""

import dataclasses

from reports import tables
from reports.frame import to_frame
from tests.reports.helpers import fixture_records


def test_a_column_missing_in_every_row_is_dropped_and_named():
    text = tables.markdown(["shape", "arm", "peak", "planned"],
                           [("s16", "engine", "-", "3 MiB"), ("s16", "native", "-", "-")],
                           why={"peak": "no memory_stats"})
    lines = text.splitlines()
    assert lines[0] == "| shape | arm | planned |"
    assert lines[2:4] == ["| s16 | engine | 3 MiB |", "|  | native | - |"]
    assert lines[-1] == "Not shown, no value in any row: peak (no memory_stats)."
    assert "Not shown" not in tables.markdown(["a", "b"], [("x", "-"), ("y", "1")])


def test_cpu_memory_table_drops_peak_measured_and_keeps_it_where_measured():
    cpu = tables.memory(to_frame(fixture_records()), "peft-decoder")
    assert "peak measured" not in cpu.splitlines()[0]
    assert ("Not shown, no value in any row: peak measured (the cell process's since it "
            "started) (the backend has no memory_stats)") in cpu
    measured = []
    for r in fixture_records():
        if r.ok:
            r = dataclasses.replace(r, memory=dataclasses.replace(
                r.memory, peak_bytes_in_use=3 * 2**20))
        measured.append(r)
    gpu = tables.memory(to_frame(measured), "peft-decoder")
    assert gpu.splitlines()[0].startswith(
        "| shape | arm | peak measured (the cell process's since it started) |")
    assert "| 3.0 MiB |" in gpu and "Not shown" not in gpu


def test_the_shape_label_is_written_once_per_shape_even_when_rows_interleave():
    records = fixture_records(("engine", "native"))
    shuffled = [records[i] for i in (0, 4, 1, 5, 2, 6, 3, 7)]  # shapes alternate
    text = tables.timing(to_frame(shuffled), "native")
    rows = [line for line in text.splitlines()[2:] if line.startswith("|")]
    shapes = [row.split(" | ")[0].lstrip("| ") for row in rows]
    assert shapes == ["tiny s16 b4 ga1 float32", "", "tiny s32 b4 ga1 float32", "",
                      "tiny s16 b4 ga2 float32", "", "tiny s32 b4 ga2 float32", ""]
    assert text.count("tiny s16 b4 ga1 float32") == 1


def test_parity_fail_shows_in_the_timing_and_parity_tables():
    df = to_frame(fixture_records())
    timing = tables.timing(df, "native")
    peft_ga2 = [line for line in timing.splitlines() if "| peft-decoder |" in line]
    assert [line.rstrip(" |").rsplit("| ", 1)[1] for line in peft_ga2] == [
        "PASS", "FAIL", "PASS", "FAIL"]
    assert "not comparable work (fails parity)" in peft_ga2[1]
    assert "not comparable work (fails parity)" not in peft_ga2[0]
    parity = tables.parity(df)
    assert parity.count("| FAIL: mean of micro-batch means (optax.MultiSteps) |") == 2
    assert parity.count("| PASS |") == 10


def test_the_parity_section_names_each_loss_and_a_tunix_grpo_shape_says_so():
    records = fixture_records(("engine",))
    tunix = [dataclasses.replace(r, config_hash="t" + r.config_hash, spec=dataclasses.replace(
        r.spec, loss="tunix-grpo", loss_agg_mode="seq-mean-token-sum", beta=0.04))
        for r in records]
    df = to_frame(records + tunix)
    version = records[0].environment.versions["google-tunix"]
    assert tables.losses(df).splitlines() == [
        "Loss: next-token cross-entropy (arms.workload.losses).",
        f"Loss: tunix.rl.algo_core.grpo_loss_fn (google-tunix {version}; loss_agg_mode "
        "seq-mean-token-sum, beta 0.04, epsilon 0.2) on rollouts."]
    shapes = [line.split(" | ")[0].lstrip("| ") for line in tables.parity(df).splitlines()[2:]]
    assert "tiny s16 b4 ga1 float32 tunix-grpo" in shapes and "tiny s16 b4 ga1 float32" in shapes
