"""harness.measure.xplane on real GPU captures recorded by others (tests/data/traces, see
its README),
each figure checked against one computed here from the raw events, by other means."""

import collections
import pathlib
import re

import pytest
from jax.profiler import ProfileData

from harness.measure import trace, xplane

TRACES = pathlib.Path(__file__).resolve().parents[2] / "data" / "traces"
CAPTURES = sorted(TRACES.glob("*/*.xplane.pb"))


def _covered_ns(spans) -> float:
    """Time at least one span covers: a sweep over the sorted boundaries, counting how many
    spans are open (not the parser's merge of sorted intervals)."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
                   key=lambda e: (e[0], -e[1]))
    total, depth, opened = 0.0, 0, None
    for time, step in edges:
        if depth == 0 and step == 1:
            opened = time
        depth += step
        if depth == 0:
            total += time - opened
    return total


def _expected(path) -> dict:
    """Per device plane, from the raw events: busy ns (kernels: events whose host launch is
    not a memory copy), executions per module (distinct host dispatches,
    `PJRT_LoadedExecutable_Execute`, holding a launch of that module's ops on that device)
    and the op with the most summed time."""
    data = ProfileData.from_file(str(path))
    launches, dispatches, device_events = {}, [], collections.defaultdict(list)
    for plane in data.planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if plane.name.startswith("/device:"):
                    if "correlation_id" in stats:
                        device_events[plane.name].append((event, stats))
                elif "correlation_id" in stats:
                    launches[str(stats["correlation_id"])] = (event.start_ns, event.name, stats)
                elif event.name == "PJRT_LoadedExecutable_Execute":
                    dispatches.append((event.start_ns, event.start_ns + event.duration_ns))
    expected = {}
    for device, events in device_events.items():
        kernels, modules, by_op = [], collections.defaultdict(set), collections.Counter()
        for event, stats in events:
            launch_start, launch_name, launch_stats = launches[str(stats["correlation_id"])]
            copy = "memcpy" in launch_name.lower() or "memcpy_details" in launch_stats
            if not copy:
                kernels.append((event.start_ns, event.start_ns + event.duration_ns))
                by_op[stats.get("hlo_op", event.name)] += event.duration_ns
            if "hlo_module" in stats:
                (window,) = [d for d in dispatches if d[0] <= launch_start <= d[1]]
                modules[stats["hlo_module"]].add(window)
        expected[device] = {"busy_ns": _covered_ns(kernels),
                            "modules": {m: len(w) for m, w in modules.items()},
                            "top_op": by_op.most_common(1)[0][0]}
    return expected


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.parent.name)
def test_device_planes_of_real_captures(path):
    expected = _expected(path)
    found = {d["name"]: d for d in trace.summarize(str(path))["devices"]}
    assert set(found) == set(expected)  # every active plane, and no idle one
    for device, want in expected.items():
        got = found[device]
        assert got["busy_ms"] == pytest.approx(want["busy_ns"] / 1e6, rel=1e-3), device
        assert got["modules"] == want["modules"], device
        assert got["executions"] == sum(want["modules"].values()), device
        assert got["top_ops"][0]["name"] == want["top_op"], device
        assert got["busy_ms"] > 0 and got["span_ms"] >= got["busy_ms"]


def test_the_busy_device_need_not_be_the_first():
    """jax_conv_minimal: the convolution runs on GPU:1..7 too; GPU:0 holds the copies."""
    (path,) = [p for p in CAPTURES if p.parent.name.endswith("conv_minimal_08")]
    found = {d["name"]: d for d in trace.summarize(str(path))["devices"]}
    assert {f"/device:GPU:{i}" for i in range(8)} <= set(found)
    assert found["/device:GPU:0"]["memcpy_ms"] > 0
    assert all(found[f"/device:GPU:{i}"]["modules"] == {"jit_forward_3d_conv": 5}
               for i in range(1, 8))


def test_every_capture_of_the_data_readme_is_here():
    assert [p.parent.name for p in CAPTURES] == [
        "tracelens-jax-te-fused-attn", "tracelens-mi300-jax08_attention",
        "tracelens-mi300-jax08_elementwise", "tracelens-mi300-jax08_gemm",
        "tracelens-mi300-jax_conv_minimal_08"]


def test_a_capture_without_step_annotations_is_one_window():
    summary = trace.summarize(str(CAPTURES[0]))
    assert summary["steps"] == [] and summary["devices"]
    assert trace.parse_steps(str(CAPTURES[0])) == []


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.parent.name)
def test_each_devices_span_splits_into_compute_collectives_copies_and_idle(path):
    """The breakdown adds up to the span exactly (float sums: rel 1e-9), and its busy part
    is the union of the device's ops counted a second way (xplane.union_ns)."""
    capture = xplane.read(str(path))
    for device in trace.summarize(str(path))["devices"]:
        parts = device["breakdown_ms"]
        assert set(parts) == set(xplane.BREAKDOWN)
        assert sum(parts.values()) == pytest.approx(device["span_ms"], rel=1e-9)
        mine = [(op.start, op.end) for op in capture.ops if op.device == device["name"]]
        assert parts["compute"] + parts["collectives"] + parts["copies"] == pytest.approx(
            xplane.union_ns(mine) / 1e6, rel=1e-9)
        assert parts["compute"] > 0 and min(parts.values()) >= 0


def test_an_instant_goes_to_compute_then_collectives_then_copies_then_idle():
    def op(name, start, end, memcpy=False):
        return xplane.Op(device="d", name=name, start=start, end=end, memcpy=memcpy,
                         execution=None, module=None)

    ops = [op("fusion.1", 0, 10), op("all-gather-start.2", 5, 20), op("copy.3", 15, 30),
           op("memcpy", 28, 32, memcpy=True)]
    assert xplane.breakdown_ns(ops, 0, 40) == {"compute": 10.0, "collectives": 10.0,
                                               "copies": 12.0, "idle": 8.0}


TPU_CAPTURE = TRACES / "parity-tpu-v5e-native" / "native-s1024-b2.xplane.pb.xz"


@pytest.fixture(scope="module")
def tpu_capture(tmp_path_factory) -> str:
    import lzma

    path = tmp_path_factory.mktemp("tpu") / "native.xplane.pb"
    path.write_bytes(lzma.decompress(TPU_CAPTURE.read_bytes()))
    return str(path)


def test_a_tpu_captures_top_ops_are_its_bodies_ops_per_step(tpu_capture):
    """The v5e capture (3 annotated steps of native at seq 1024 batch 2): its "XLA Ops" line
    names each op by its whole HLO instruction, and a loop's or a conditional's event spans
    its body's ops. Counted here from the raw events: every op but while, conditional and
    call, summed by instruction name and divided by the steps."""
    by_op, busy, steps = collections.Counter(), [], 0
    for plane in ProfileData.from_file(tpu_capture).planes:
        for line in plane.lines:
            if plane.name == "/device:TPU:0" and line.name == "XLA Ops":
                for event in line.events:
                    busy.append((event.start_ns, event.start_ns + event.duration_ns))
                    head = event.name.split(" = ")[0]
                    if not re.search(r" (while|conditional|call)\(", event.name):
                        by_op[head.lstrip("%")] += event.duration_ns
            steps += sum(e.name == "train" for e in line.events)
    assert steps == 3
    (device,) = trace.summarize(tpu_capture)["devices"]
    top = device["top_ops"]
    assert [op["name"] for op in top] == [name for name, _ in by_op.most_common(10)]
    for op in top:
        assert op["ms_per_step"] == pytest.approx(by_op[op["name"]] / 3 / 1e6, rel=1e-9)
        assert op["category"] != "control flow"
    assert top[0]["name"] == "fusion.9" and top[0]["shape"].startswith("(f32[151936,1024]")
    # the ranked ops account for the device's busy time (no wrapper counted twice)
    assert device["busy_ms"] == pytest.approx(_covered_ns(busy) / 1e6, rel=1e-9)
    assert device["ranked_ms"] == pytest.approx(device["busy_ms"], rel=0.02)
    assert device["ranked_ms"] <= device["busy_ms"] * 1.0001


def test_a_tpu_captures_summary_is_short_lines_with_the_full_text_on_request(tpu_capture):
    summary = trace.summarize(tpu_capture)
    rows = [line for line in trace.text(summary).splitlines() if line.startswith("| ")]
    assert rows and max(len(line) for line in rows) <= trace.LINE
    assert "| 7.543 | 1 | fusion.9 | fusion: loop | (f32[151936,1024], f32[151936,1024], " \
           "... 2 more) |" in rows
    full = trace.text(summary, full=True)
    assert "`%fusion.9 = (f32[151936,1024]{1,0:T(8,128)}" in full
