"""A worker's end turned into a record (harness.orchestrator.spawn.classify): out of
memory, killed, a lost peer, a compiler abort; and what a cell's exception stands for."""

import dataclasses
import signal

from harness.grid.expand import expand
from harness.jobs.run import run_grid
from tests.harness.cli_helpers import cli_env
from tests.harness.orchestrator.test_loop import PLUGIN, TINY


def test_out_of_memory_is_recorded_as_oom_and_an_outside_sigkill_as_killed(tmp_path):
    import tests.harness.fault_arms  # noqa: F401 - registers the test arms for expand()

    cells = expand({**TINY, "arms": ["test-oom", "test-sigkill"], "parity": False})
    cells = [dataclasses.replace(c, plugins=(PLUGIN,)) for c in cells]
    _, records = run_grid(cells, tmp_path, env=cli_env(), timeout_s=300)
    oom, killed = records
    assert oom.error.reason == "oom", oom.error
    assert "RESOURCE_EXHAUSTED: Out of memory allocating" in oom.error.message
    assert killed.error.reason == "killed", killed.error
    assert "SIGKILL from outside the harness" in killed.error.message
    assert "peak RSS was" in killed.error.message

def test_a_sigkill_the_kernel_counted_as_an_oom_kill_is_oom():
    from harness.orchestrator.spawn import Exit, classify

    def reason(**ended):
        return classify(Exit(**{"stderr": "", "wrote_record": False, **ended}), 60).error

    assert reason(code=-signal.SIGKILL, oom_kills=1, max_rss_bytes=3 << 30).reason == "oom"
    assert "OOM killer; its peak RSS was 3.00 GiB" in reason(
        code=-signal.SIGKILL, oom_kills=1, max_rss_bytes=3 << 30).message
    assert reason(code=-signal.SIGKILL).reason == "killed"
    assert reason(code=1, stderr="jaxlib...RESOURCE_EXHAUSTED: ...").reason == "oom"
    assert reason(code=None).reason == "timeout"
    # a timed-out cell says where it was, from the phases its worker noted as they ended
    assert reason(code=None).message == ("cell exceeded its 60 s timeout; it ended no phase "
                                         "(stuck starting or importing)")
    assert reason(code=None, progress="start 0.5\nimports 3.0\nbuild 4.5\n").message == (
        "cell exceeded its 60 s timeout; phases ended: start 0.5 s, imports 3.0 s, build "
        "4.5 s; the next ran 52.0 s without ending")
    assert reason(code=-signal.SIGSEGV).reason == "crash"
    assert classify(Exit(code=0, stderr="", wrote_record=True), 60) is None

def test_a_collective_that_lost_its_peer_is_peer_died_only_in_a_multi_process_cell():
    """A process whose peer died before gloo's first collective gets an exception, not the
    heartbeat abort; both must be recorded as `peer-died`."""
    from harness.cell.run import exception_failure
    from harness.orchestrator.spawn import Exit, classify

    one = expand({**TINY, "arms": ["native"]})[0]
    two = dataclasses.replace(one, distributed={"coordinator": "localhost:1",
                                                "num_processes": 2, "process_id": 0})
    gloo = RuntimeError("UNKNOWN: Gloo context initialization failed: DEADLINE_EXCEEDED: "
                        "Deadline Exceeded")
    assert exception_failure(gloo, two).reason == "peer-died"
    assert "did not reach the collective within gloo's timeout" in exception_failure(
        gloo, two).message
    assert exception_failure(gloo, one).reason == "exception"
    oom = RuntimeError("RESOURCE_EXHAUSTED: Out of memory allocating 8 bytes")
    assert exception_failure(oom, two).reason == "oom"
    assert exception_failure(ValueError("shape"), two).reason == "exception"
    aborted = Exit(code=-signal.SIGABRT, wrote_record=False,
                   stderr="Task /job:jax_worker/task:1 stopped sending heartbeats")
    assert classify(aborted, 60).error.reason == "peer-died"

def test_a_crash_names_what_xla_said_as_it_aborted():
    """A compiler CHECK failure kills the cell with SIGABRT before it writes a record: the
    failure says what the check was (glog's FATAL line), not only the signal."""
    import signal

    from harness.orchestrator.spawn import Exit, classify

    stderr = ("E1202 06:11:09.563711 24905 coredump_hook.cc:348] RAW: Skipping coredump\n"
              "F1202 06:11:09.358174 24905 fusion_emitter.cc:2978] Check failed: "
              "Bits::IsPowerOfTwo(bound) Scaled window bound is not a power of 2\n"
              "E1202 06:11:10.080365 24905 process_state.cc:794] RAW: Raising signal 6\n")
    record = classify(Exit(code=-signal.SIGABRT, stderr=stderr, wrote_record=False), 60)
    assert record.error.reason == "crash"
    assert record.error.message == (
        "cell process was killed by SIGABRT without a record; it said: Check failed: "
        "Bits::IsPowerOfTwo(bound) Scaled window bound is not a power of 2")
