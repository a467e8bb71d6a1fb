"""harness.measure.trace: busy time read from real XLA:CPU traces."""

import jax
import jax.numpy as jnp
import pytest
from jax.profiler import ProfileData

from harness.contract import STEP_ANNOTATION
from harness.measure import trace

ASYNC_MARGIN_NS = 1e6
"""An op counts as asynchronous when it completes this long after its launch event ends."""


def _transposed_dot(a, b):
    """a^T b^T-style contraction (dim 0 of `a` with dim 1 of `b`), the shape of a weight
    gradient: XLA:CPU emits an Eigen dot for it, which runs on its intra-op thread pool."""
    return jax.lax.dot_general(a, b, (((0,), (1,)), ((), ())))


def _traced_steps(directory: str, steps: int = 2) -> str:
    a = jnp.ones((2048, 512), jnp.float32)
    b = jnp.ones((1024, 2048), jnp.float32)
    step = jax.jit(lambda a, b: (_transposed_dot(a, b), _transposed_dot(2 * a, b)))
    jax.block_until_ready(step(a, b))
    with trace.capture(directory) as logdir:
        for i in range(steps):
            with jax.profiler.StepTraceAnnotation(STEP_ANNOTATION, step_num=i):
                jax.block_until_ready(step(a, b))
    return trace.find_xplane(logdir)


def _dot_spans(path: str) -> tuple[list[tuple[float, float]], list[tuple[float, float, float]]]:
    """Read independently of harness.measure.trace: the step windows, and each dot's (launch start,
    launch end, completion end) paired by the flow id XLA gives both events. The last op
    can complete after the profiler stopped recording (its output was ready first): such a
    launch has no completion here and is left out."""
    windows, launches, completions = [], {}, {}
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                end = event.start_ns + event.duration_ns
                if event.name == STEP_ANNOTATION and "step_num" in stats:
                    windows.append((event.start_ns, end))
                elif str(stats.get("hlo_op", "")).startswith("dot"):
                    launches[stats["_p"]] = (event.start_ns, end)
                elif event.name.startswith("end: dot"):
                    completions[stats["_c"]] = end
    dots = [(start, end, completions[flow]) for flow, (start, end) in launches.items()
            if flow in completions]
    return sorted(windows), dots


def test_busy_time_lasts_until_each_asynchronous_op_completes(tmp_path):
    path = _traced_steps(str(tmp_path))
    windows, dots = _dot_spans(path)
    assert any(done - end > ASYNC_MARGIN_NS for _, end, done in dots), (
        "XLA:CPU ran no dot asynchronously, so this trace cannot tell launch from completion")
    steps = trace.parse_steps(path)
    assert [s.executions for s in steps] == [1, 1]
    for (begin, finish), step in zip(windows, steps, strict=True):
        longest = max((done - start for start, _, done in dots if begin <= start <= finish),
                      default=0.0)
        assert step.busy_ns >= longest, (step.busy_ns, longest)
        assert step.busy_ns <= step.wall_ns


@pytest.mark.slow  # a traced cell process (~13 s)
def test_parity_trace_of_a_cells_capture_reads_what_its_record_holds(tmp_path):
    """`parity run --trace` records per-step executions and busy time; `parity trace` of the
    same capture gives the same, and the same for its one device (the host's XLA:CPU)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from reports.record import read_dir

    repo = Path(__file__).resolve().parents[3]
    env = dict(os.environ, PYTHONPATH=str(repo), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    run = subprocess.run([sys.executable, "-m", "harness.cli", "run", "--arms", "engine",
                          "--preset", "tiny", "--seq", "16", "--batch", "4", "--ga", "2",
                          "--steps", "2", "--warmup", "1", "--trace", "--trace-steps", "2",
                          "--no-parity", "--out", str(tmp_path)], env=env, cwd=repo,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    (record,) = read_dir(tmp_path)
    shown = subprocess.run([sys.executable, "-m", "harness.cli", "trace", record.trace.logdir,
                            "--json"], env=env, cwd=repo, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert [s["executions"] for s in summary["steps"]] == record.trace.executions_per_step
    assert [s["busy_ms"] for s in summary["steps"]] == record.trace.busy_ms
    assert [s["wall_ms"] for s in summary["steps"]] == record.trace.step_ms
    (host,) = summary["devices"]
    assert host["name"] == "/host:CPU" and host["executions"] >= sum(
        record.trace.executions_per_step)  # the traced steps, and what ran around them
    assert set(host["modules"]) >= {"jit_fwd_bwd", "jit_fwd_bwd_accumulate", "jit_update"}
