"""The report of the TPU v5e chip's committed records (docs/results/tpu-v5e/chip-*.jsonl):
cells with and without a gradient check, refused cells and arms not run there, in one
document."""

import shutil
from pathlib import Path

from reports.document import render

CHIP = Path(__file__).resolve().parents[2] / "docs" / "results" / "tpu-v5e"


def test_the_chip_records_render_with_checked_unchecked_and_refused_cells(tmp_path):
    for name in ("chip-s1024-ga1.jsonl", "chip-batch8.jsonl"):
        shutil.copy(CHIP / name, tmp_path / name)
    text = render(tmp_path, tmp_path / "parity.md")
    assert "Gradient parity: 3 PASS, 0 FAIL, 2 not checked." in text
    assert "engine: does-not-fit: does not fit: planned 16.69 of 15.75 GiB" in text
    # a shape whose cells were not checked has no data digest: shown as missing
    assert "| qwen3-0.6b s1024 b8 ga1 bfloat16 | engine-fused | - | - | - |" in text
    assert "**Not run here**" in text and "maxtext not installed" in text


def test_planned_vs_measured_reads_the_chips_memory_stats_and_the_cells_own_plan(tmp_path):
    """native at seq 1024 batch 2 on the v5e: 9,567,186,432 bytes in use at peak plus
    3,571,089,408 reserved for the step's temporaries, against its fit check's plan of
    13,396,195,328; its roofline (the plan's bound) 98.7 ms against 119.3 measured."""
    from reports.frame import to_frame
    from reports.measured import measured_peak, planned_vs_measured
    from reports.record import read_dir

    shutil.copy(CHIP / "chip-s1024-ga1.jsonl", tmp_path / "chip.jsonl")
    frame = to_frame(read_dir(tmp_path))
    native = frame[(frame["arm"] == "native")].iloc[0]
    assert measured_peak(native) == 9_567_186_432 + 3_571_089_408
    assert native["plan_peak"] == 13_396_195_328
    table = planned_vs_measured(frame)
    row = next(line for line in table.splitlines() if "| native |" in line)
    cells = [c.strip() for c in row.split("|")]
    # in use, reserved, their sum, planned (GiB); planned / measured = 13.396 / 13.138 GB
    assert cells[4:9] == ["8.910", "3.326", "12.236", "12.476", "1.020"], cells
    assert cells[9:13] == ["119.3", "98.7", "memory", "1.21"], cells
    # engine-fused's peak in use holds 2.2 GiB more than its step's plan: printed as a gap
    fused = next(line for line in table.splitlines() if "| engine-fused |" in line)
    assert "0.865 **gap**" in fused


def test_cells_run_on_the_chip_lead_with_their_own_plans_exact_costs(tmp_path):
    """The XLA cost model is not reachable through the TPU's PJRT C API for most programs
    (the records say why): the exact comparisons then come from each cell's own plan on the
    chip, one count for every arm, said in the header; the plan's columns that would repeat
    them are not printed again."""
    shutil.copy(CHIP / "chip-s1024-ga1.jsonl", tmp_path / "chip.jsonl")
    text = render(tmp_path, tmp_path / "parity.md")
    header = text.splitlines()[8]
    assert header == ("| shape | arm | HBM bytes/step (plan) | planned peak (executable + "
                      "held state) | program calls/step | planned matmul/model FLOPs | "
                      "collective bytes/step on v5e:1x1 |"), header
    native = next(line for line in text.splitlines() if line.startswith("|  | native |"))
    # 75.318 GiB of HBM a step and 10.691 TFLOP of matmuls over 8.045 T model FLOPs
    assert native == ("|  | native | 77125.7 MiB (1.00x) | 12775.6 MiB (1.00x) | 1 (1.00x) | "
                      "1.329 (1.00x) | 0.000 GiB |"), native
    assert "[runtime]" not in text and "[plan]" not in text  # one source in every row


def test_a_shape_whose_cells_mix_sources_tags_each_figure(tmp_path):
    """A cell without a plan of its own (its fit check turned off) beside cells with one:
    its figure is the runtime's count, and each figure of that shape says which it is. The
    plan's columns it adds are this table's: the next table of the process has none."""
    from reports.frame import to_frame
    from reports.record import read_dir
    from reports.summary import EXACT, exact

    exact_before = list(EXACT)

    shutil.copy(CHIP / "chip-s1024-ga1.jsonl", tmp_path / "chip.jsonl")
    frame = to_frame(read_dir(tmp_path))
    unplanned = frame["arm"] == "engine"
    frame.loc[unplanned, "cost_source"] = "runtime"
    frame.loc[unplanned, "bytes_accessed_per_step"] = 1.0 * 2**30
    table = exact(frame, "native")
    assert exact_before == EXACT
    engine = next(line for line in table.splitlines() if "| engine |" in line)
    native = next(line for line in table.splitlines() if "| native |" in line)
    assert "1024.0 MiB (0.01x) [runtime]" in engine and "MiB (1.00x) [plan]" in native


def test_the_dashboard_cell_page_shows_planned_vs_measured(tmp_path):
    from reports.record import read_dir
    from reports.site import writer

    shutil.copy(CHIP / "chip-s1024-ga1.jsonl", tmp_path / "chip.jsonl")
    out = tmp_path / "site"
    writer.publish(read_dir(tmp_path), out, source="chip")
    pages = {p.name: p.read_text() for p in (out / "cells").glob("*.html")}
    native = next(t for n, t in pages.items() if n.startswith("native"))
    section = native.split("Planned vs measured (the latest run's own plan)</h3>")[1]
    assert '<td class="num">12.476</td><td class="num">1.020</td>' in section
    fused = next(t for n, t in pages.items() if n.startswith("engine-fused"))
    assert '<td class="num">0.865 <b>gap</b></td>' in fused


def test_the_chip_s_head_to_head_decides_at_two_rounds_by_the_tpu_s_process_spread(tmp_path):
    """qwen3-0.6b seq 1024 GA 4 on the v5e, two or three interleaved processes an arm:
    PeftTrainer's 381.0 ms (2 runs) against the engine's 259.3 (3 runs) is decided slower at
    the TPU's process-spread bound (under 1.03x), where the CPU machine's bound (1.63x at
    2 + 2) left it "too few samples"; native's 3.5% lead is beyond the TPU's spread too:
    faster at the TPU's 1% minimum effect, detected under a 5% one (never "too few
    samples": the samples decided it)."""
    from reports import stats
    from reports.frame import to_frame
    from reports.record import read_dir
    from reports.tables import speedup

    shutil.copy(CHIP / "h2h" / "chip-h2h-s1024-ga4.jsonl", tmp_path / "chip.jsonl")
    frame = to_frame(read_dir(tmp_path))
    engine = frame[frame["arm"] == "engine"].iloc[0]
    assert engine["backend"] == "tpu" and engine["rounds"] == 3
    peft = speedup(frame, engine, "peft-decoder")  # median(peft) / median(engine)
    assert peft.spread_bound < 1.03 and 1.46 < peft.ratio < 1.48
    assert stats.verdict(peft) == stats.SLOWER
    native = speedup(frame, engine, "native")
    assert 0.96 < native.ratio < 0.97 and native.min_effect == stats.TPU_MIN_EFFECT == 0.01
    assert stats.verdict(native) == stats.FASTER  # the engine is 3.5% slower than native
    assert stats.verdict(native, min_effect=0.05) == stats.UNDER


def test_the_traced_table_sets_each_arm_s_traced_step_against_its_untraced_one(tmp_path):
    """The v5e at seq 1024 GA 1: the engine without its pure-state cache spends 258.5 ms a
    step between device work (the device's 113.4 ms is the engine's); tracing costs it
    nothing measurable (371.9 traced / 371.9 untraced), and native 0.3%."""
    shutil.copy(CHIP / "h2h" / "chip-h2h-s1024-ga1.jsonl", tmp_path / "chip.jsonl")
    text = render(tmp_path, tmp_path / "out" / "parity.md")
    section = text[text.index("Executions, host"):text.index("<summary><b>Noise")]
    rows = {line.split("|")[2].strip(): [c.strip() for c in line.split("|")[3:10]]
            for line in section.splitlines() if line.startswith("| ")}
    assert rows["engine-no-state-cache"] == ["2", "371.9", "371.9", "1.000x", "113.4", "258.5",
                                             "173.99"]
    assert rows["engine"][:6] == ["2", "115.0", "115.1", "1.001x", "113.4", "1.7"]
    assert rows["native"][:4] == ["1", "114.5", "114.8", "1.003x"]


def test_a_peak_the_build_reached_is_not_read_as_the_step_s(tmp_path):
    """The chip's records read the device after the build as well: engine-fused's and
    PeftTrainer's peak in use was already reached when the build ended (no step raised
    it), so their sum with the step's reservation is the build's, never a gap; the split
    engine's peak was raised by its steps (its fwd_bwd's float32 gradient) and is read as
    the step's, 1.007 of its plan."""
    from reports.frame import to_frame
    from reports.measured import planned_vs_measured
    from reports.record import read_dir

    shutil.copy(CHIP / "chip-67-s1024-ga1-checked.jsonl", tmp_path / "chip.jsonl")
    frame = to_frame(read_dir(tmp_path))
    at = dict(zip(frame["arm"], frame["peak_at"], strict=True))
    assert at["engine"] == "steps"
    assert at["engine-fused"] == at["peft-decoder"] == at["peft-tunix"] == "build"
    table = planned_vs_measured(frame)
    assert "**gap**" not in table
    fused = next(line for line in table.splitlines() if "| engine-fused |" in line)
    assert "| 0.994 (the build's peak) |" in fused
    engine = next(line for line in table.splitlines() if "| engine |" in line)
    assert "| 11.666 | 1.007 |" in engine


def test_the_seven_arms_head_to_head_names_its_commit_and_lists_only_real_gaps(tmp_path):
    """issue 73's head-to-head (docs/results/tpu-v5e/h2h73): all seven arms at seq 1024 GA 1,
    seq 1024 GA 4 and seq 4096 GA 1, and the four the suite runs at seq 4096 GA 4 (the arms
    on our decoder), two rounds each, every gradient checked in round 0 and every record of
    main's clean commit of its session (GA 4's round 1 of engine, native and engine-fused
    from a later one). At ragged GA 4 the PeftTrainer arms FAIL against sum/sum (their mean
    of means, by design). peft-tunix's cost is known (its program was costed), so the list
    of costs XLA could not give names the others at each shape and never peft-tunix (a row
    whose reason is absent is not a row with the reason "nan")."""
    import json

    from reports.frame import to_frame
    from reports.record import read_dir

    source = CHIP / "h2h73" / "h2h73-tpu-v5e.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines()]
    shapes = ((1024, 1), (1024, 4), (4096, 1), (4096, 4))
    by_shape = {s: [r for r in records if (r["spec"]["seq"], r["spec"]["ga"]) == s]
                for s in shapes}
    assert [len(by_shape[s]) for s in shapes] == [14, 14, 14, 8] and len(records) == 50
    assert {r["arm"] for r in by_shape[4096, 4]} == {"engine", "engine-fused", "native",
                                                      "peft-decoder"}
    for found in by_shape.values():  # each arm once in each round
        assert sorted((r["round"], r["arm"]) for r in found) == sorted(
            (n, r["arm"]) for r in found if r["round"] == 0 for n in (0, 1))
    commits = {s: {(r["environment"]["git_sha"][:7], r["environment"]["git_dirty"])
                   for r in found} for s, found in by_shape.items()}
    assert commits == {(1024, 1): {("0fbb02c", False)},
                       (1024, 4): {("7af9434", False), ("549b513", False)},
                       (4096, 1): {("549b513", False)},
                       (4096, 4): {("c5e5d79", False)}}
    late = {r["arm"] for r in by_shape[1024, 4] if r["environment"]["git_sha"][:7] == "549b513"}
    assert late == {"engine", "native", "engine-fused"}
    shutil.copy(source, tmp_path / "chip.jsonl")
    frame = to_frame(read_dir(tmp_path))
    assert frame["arm"].nunique() == 7
    text = render(tmp_path, tmp_path / "out" / "parity.md")
    assert "Gradient parity: 21 PASS, 4 FAIL." in text
    for arm in ("peft-decoder", "peft-tunix", "peft-maxtext"):
        row = next(line for line in text.splitlines()
                   if line.startswith(f"|  | {arm} | **FAIL**"))
        assert "mean of micro-batch means (optax.MultiSteps)" in row and ": PASS)" in row
    listed = text[text.index("Compiled cost unavailable:"):].split("\n\n")[0]
    assert listed.count("\n- ") == 22 and "peft-tunix" not in listed and "nan" not in listed


def _with_engine_options(tmp_path, attention: str, slower: float) -> Path:
    """The h2h73 records of seq 1024 GA 1 (one shape) plus a second set of the engine's, as
    if run with `attention` (its blocks the defaults), every step `slower` times as long."""
    import json

    from harness.contract import cell_hash

    lines = [line for line in (CHIP / "h2h73" / "h2h73-tpu-v5e.jsonl").read_text().splitlines()
             if (json.loads(line)["spec"]["seq"], json.loads(line)["spec"]["ga"]) == (1024, 1)]
    extra = []
    for line in lines:
        record = json.loads(line)
        if record["arm"] != "engine":
            continue
        record["spec"]["attention"] = attention
        record["config_hash"] = cell_hash(record["spec"])  # as the runner keys a cell
        timing = record["timing"]
        timing["step_ms"] = [t * slower for t in timing["step_ms"]]
        timing["stats"] = {k: v * slower if k.endswith("_ms") else v
                           for k, v in timing["stats"].items()}
        extra.append(json.dumps(record))
    (tmp_path / "chip.jsonl").write_text("\n".join(lines + extra) + "\n")
    return tmp_path


def test_an_arm_run_with_two_option_sets_is_set_against_the_defaults_not_itself(tmp_path):
    """The engine at one shape with XLA's attention (the defaults) and with splash, 10%
    slower: the splash row reads 0.91x against the engine (never its own 1.00x), and every
    other arm is set against the plain engine (native 1.00x, as in the chip's own table),
    not against whichever engine row came first."""
    from reports.frame import to_frame
    from reports.record import read_dir
    from reports.tables import is_baseline, speedup, timing

    frame = to_frame(read_dir(_with_engine_options(tmp_path, "splash", 1.10)))
    engines = frame[frame["arm"] == "engine"]
    plain = engines[engines["decoder_options"].fillna("") == ""].iloc[0]
    splash = engines[engines["decoder_options"].fillna("") != ""].iloc[0]
    assert is_baseline(frame, plain, "engine") and not is_baseline(frame, splash, "engine")
    assert 1.09 < 1 / speedup(frame, splash, "engine").ratio < 1.11
    native = frame[frame["arm"] == "native"].iloc[0]
    assert 0.99 < speedup(frame, native, "engine").ratio < 1.01
    rows = {line.split("|")[2].strip(): line.split("|")[8].strip()
            for line in timing(frame, "engine").splitlines() if line.startswith("| ")}
    assert rows["engine"] == "1.00x"
    assert rows["engine (attention=splash/512x1024)"] == "0.91x [0.91, 0.91]"
    assert rows["native"].startswith("1.00x")


def test_the_fastest_is_named_with_its_options_and_only_its_row_is_marked(tmp_path):
    """The engine with splash at 0.85 of the plain engine's time leads peft-tunix (97.7
    against 106.8 ms): the summary names `engine (attention=splash/512x1024)` the fastest
    and marks that row alone, not the plain engine's row of the same arm."""
    text = render(_with_engine_options(tmp_path, "splash", 0.85), tmp_path / "out" / "p.md")
    assert ("fastest **engine (attention=splash/512x1024)** (engine (attention=splash/"
            "512x1024) is faster than every other arm beyond noise)") in text
    marked = [line for line in text.splitlines() if "(fastest)" in line]
    assert len(marked) == 1 and "**engine (attention=splash/512x1024)** (fastest)" in marked[0]


def test_a_check_that_says_the_distance_from_exact_float32_shows_it_beside_rel_l2(tmp_path):
    """A round-0 record whose check gave the arm's distance from exact float32: the
    gradient parity table reads it beside the verdict; records without it read as before."""
    import json

    lines = (CHIP / "h2h73" / "h2h73-tpu-v5e.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for record in records:
        if record["arm"] == "engine" and record["round"] == 0:
            record["parity"]["float32_rel_l2"] = 0.0234
    (tmp_path / "chip.jsonl").write_text("\n".join(map(json.dumps, records)) + "\n")
    text = render(tmp_path, tmp_path / "out" / "parity.md")
    assert "|  | engine | PASS 1.19e-02; vs exact float32 2.34e-02 |" in text.replace(
        "| qwen3-0.6b s1024 b2 ga1 bfloat16 | engine |", "|  | engine |")
    assert "|  | native | PASS 1.12e-02 |" in text
