"""The viewer commands a traced record gives, and the hint `parity run` prints."""

import shlex

from arms.spec import CellSpec
from reports.record import Record, RunOptions, Spec, Trace, section
from reports.viewers import hint, trace_commands, viewer_commands


def _record(arm: str, logdir: str | None, hlo: bool = False) -> Record:
    trace = None if logdir is None else Trace(
        xplane=f"{logdir}/plugins/profile/t/host.xplane.pb", logdir=logdir,
        executions_per_step=[1], modules_per_step=[["jit_step"]], step_ms=[1.0],
        busy_ms=[0.5], host_ms=[0.5])
    return Record(arm=arm, spec=section(Spec, CellSpec(preset="tiny", seq=16, batch=4).to_dict()),
                  run=RunOptions(steps=2, warmup=1, trace=logdir is not None, trace_steps=1,
                                 parity=True, trace_hlo=hlo), trace=trace)


def test_commands_serve_the_logdir_and_quote_it_for_the_shell():
    commands = viewer_commands("/r/traces/run 1/native-tiny-s16-b4-ga1")
    assert shlex.split(commands["xprof"]) == [
        "xprof", "--logdir", "/r/traces/run 1/native-tiny-s16-b4-ga1", "--port", "8791"]
    assert shlex.split(commands["tensorboard"]) == [
        "tensorboard", "--logdir", "/r/traces/run 1/native-tiny-s16-b4-ga1"]
    assert viewer_commands("/t/x", port=9000)["xprof"] == "xprof --logdir /t/x --port 9000"


def test_a_record_without_a_trace_has_no_commands_and_no_hint():
    assert trace_commands(_record("native", None)) is None
    assert hint([_record("native", None), Record(status="failed")]) == ""


def test_the_hint_names_each_traced_cell_with_both_commands():
    records = [_record("native", "/t/run/native-tiny-s16-b4-ga1", hlo=True),
               _record("engine", None),
               _record("engine-fused", "/t/run/engine-fused-tiny-s16-b4-ga1", hlo=True)]
    lines = hint(records).splitlines()
    assert lines[1:] == [
        "  native tiny seq=16 batch=4 ga=1:",
        "    xprof --logdir /t/run/native-tiny-s16-b4-ga1 --port 8791",
        "    tensorboard --logdir /t/run/native-tiny-s16-b4-ga1",
        "  engine-fused tiny seq=16 batch=4 ga=1:",
        "    xprof --logdir /t/run/engine-fused-tiny-s16-b4-ga1 --port 8791",
        "    tensorboard --logdir /t/run/engine-fused-tiny-s16-b4-ga1"]
    # Captured without the HLO proto: the hint says what memory_viewer needs.
    assert "--trace-hlo" not in hint(records)
    assert "--trace-hlo" in hint([_record("native", "/t/run/x")])
