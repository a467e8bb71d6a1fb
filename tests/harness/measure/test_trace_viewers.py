"""Trace captures, their names on disk, and the two viewers serving them: a real capture, a
real xprof and a real TensorBoard on local ports, asked over HTTP what they offer."""

import contextlib
import dataclasses
import gzip
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from arms.spec import CellSpec
from harness.cell.run import run_cell
from harness.cli import build_parser
from harness.cli.grid_args import request
from harness.contract import CellRun
from harness.grid.expand import expand
from harness.grid.options import merge
from harness.measure import trace
from harness.store.layout import cell_path
from reports.viewers import VIEWERS, viewer_commands

RUN_ID = "run-1"
HLO_CELL = "native-tiny-s16-b4-ga1"
PLAIN_CELL = "plain"
PROFILE_ROUTES = "/data/plugin/profile"
"""Where both servers mount the profile plugin's HTTP routes (xprof.server.make_wsgi_app;
TensorBoard's /data/plugin/<plugin name>)."""
WAIT_S = 60


def test_a_cells_path_names_run_and_cell_and_is_one_path_per_component():
    spec = CellSpec(preset="tiny", seq=32, batch=8, ga=4).to_dict()
    assert cell_path("20260101T0Z", "engine:maxtext", spec) == (
        "20260101T0Z/engine_maxtext-tiny-s32-b8-ga4")
    assert cell_path("a/b", "engine:maxtext", spec, round_index=2) == (
        "a_b/engine_maxtext-tiny-s32-b8-ga4-r2")


def test_a_rerun_under_the_same_name_never_writes_into_the_earlier_capture(tmp_path):
    step = jax.jit(lambda x: x * 2.0)
    directories = []
    for _ in range(3):
        with trace.capture(str(tmp_path), session=f"{RUN_ID}/{PLAIN_CELL}") as directory:
            step(jnp.ones(4)).block_until_ready()
        directories.append(directory)
    base = str(tmp_path / RUN_ID / PLAIN_CELL)
    assert directories == [base, f"{base}-2", f"{base}-3"]
    assert all(trace.find_xplane(d).startswith(d + os.sep) for d in directories)


@pytest.mark.parametrize(("flags", "trace", "hlo"), [
    ([], False, False),
    (["--trace-hlo"], True, True),  # asking for the HLO proto asks for a trace
    (["--trace", "--trace-hlo"], True, True),
    (["--no-trace", "--trace-hlo"], False, True),
    (["--trace"], True, False),
])
def test_trace_hlo_reaches_every_cell(flags, trace, hlo, tmp_path):
    args = build_parser().parse_args(["run", "--arms", "native,engine", "--preset", "tiny",
                                      *flags])
    cells = expand(merge(request(args, tmp_path).explicit))
    assert [(c.trace, c.trace_hlo) for c in cells] == [(trace, hlo)] * 2


@pytest.fixture(scope="module")
def captured(tmp_path_factory) -> Path:
    """One run's trace directory holding two captures: the `native` arm on `tiny`, run by the
    worker with --trace-hlo, and a tiny jitted function captured without the HLO proto."""
    root = tmp_path_factory.mktemp("traces")
    cell = CellRun(arm="native", spec=CellSpec(preset="tiny", seq=16, batch=4).to_dict(),
                   steps=2, warmup=1, trace=True, trace_steps=1, trace_dir=str(root),
                   trace_hlo=True, parity=False)
    record = run_cell(dataclasses.replace(cell, trace_session=cell_path(RUN_ID, cell.arm,
                                                                        cell.spec)))
    assert record.trace.logdir == str(root / RUN_ID / HLO_CELL)
    with trace.capture(str(root), session=f"{RUN_ID}/{PLAIN_CELL}"):
        jax.jit(lambda x: x @ x.T)(jnp.ones((8, 8))).block_until_ready()
    return root / RUN_ID


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command(viewer: str, logdir: Path, port: int) -> list[str]:
    """The command `parity run` prints (reports.viewers), run from this venv, plus what keeps
    two test servers apart: TensorBoard on 127.0.0.1:port; xprof (which takes no bind address
    and listens on every interface) with its own gRPC port instead of the fixed 50051."""
    argv = shlex.split(viewer_commands(str(logdir), port)[viewer])
    argv[0] = str(Path(sys.executable).parent / argv[0])
    if viewer == "tensorboard":
        return [*argv, "--host", "127.0.0.1", "--port", str(port)]
    return [*argv, "--grpc_port", str(_free_port())]


def _get(base: str, route: str, **params) -> bytes:
    url = f"{base}{PROFILE_ROUTES}/{route}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=30) as response:
        body = response.read()
        # The plugin gzips its answers itself (xprof.profile_plugin.respond).
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return body


def _wait_until_serving(proc: subprocess.Popen, base: str, log: Path, viewer: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{viewer} exited with code {proc.returncode} before serving; its "
                        f"output:\n{log.read_text(errors='replace')[-3000:]}")
        with contextlib.suppress(OSError):  # refused until it listens
            _get(base, "runs")
            return
        time.sleep(0.5)
    pytest.fail(f"{viewer} did not answer {base}{PROFILE_ROUTES}/runs within {WAIT_S} s; its "
                f"output:\n{log.read_text(errors='replace')[-3000:]}")


@contextlib.contextmanager
def _serving(viewer: str, logdir: Path, log: Path):
    """Starts `viewer` on `logdir` in its own process group; yields its base URL once it
    answers; always stops the group (TERM, then KILL)."""
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen(_command(viewer, logdir, port), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_until_serving(proc, base, log, viewer)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("viewer", VIEWERS)
def test_viewer_serves_the_capture_and_memory_viewer_needs_the_hlo_proto(viewer, captured,
                                                                         tmp_path):
    # A copy per viewer: the plugin caches each session's tool list in its directory, and
    # each viewer must compute its own.
    logdir = tmp_path / "logdir"
    shutil.copytree(captured, logdir)
    with _serving(viewer, logdir, tmp_path / f"{viewer}.log") as base:
        # Sessions are '<cell>/<timestamp>' below a run's directory.
        sessions = {s.split("/")[0]: s for s in json.loads(_get(base, "runs"))}
        assert set(sessions) == {HLO_CELL, PLAIN_CELL}
        tools = {cell: json.loads(_get(base, "run_tools", run=session))
                 for cell, session in sessions.items()}
        for cell_tools in tools.values():  # 'trace_viewer@' is its streaming variant
            assert {"trace_viewer", "trace_viewer@"} & set(cell_tools), cell_tools
        assert {"memory_viewer", "graph_viewer"} <= set(tools[HLO_CELL])
        assert not {"memory_viewer", "graph_viewer"} & set(tools[PLAIN_CELL])
        modules = _get(base, "module_list", run=sessions[HLO_CELL]).decode().split(",")
        (step,) = [m for m in modules if m.startswith("jit_step")]
        memory = json.loads(_get(base, "data", run=sessions[HLO_CELL], tag="memory_viewer",
                                 module_name=step))
        assert memory["maxHeap"], memory
        assert memory["moduleName"].startswith("jit_step"), memory.get("moduleName")
