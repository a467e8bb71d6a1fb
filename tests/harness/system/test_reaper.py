"""A killed `parity run` / `ab` / `bisect` / `nightly` leaves nothing behind: no worker, no
temp dir, no git worktree (harness.system.reaper), and says what it kept when it can."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.contract import WORKER_NAME
from harness.system import reaper

REPO = Path(__file__).resolve().parents[3]
CELL = ["--arms", "test-hang", "--plugin", "tests.harness.fault_arms", "--preset", "tiny",
        "--seq", "16", "--batch", "4", "--steps", "2", "--warmup", "1"]
COMMANDS = {
    "run": ["run", *CELL],
    "ab": ["ab", "HEAD", "HEAD", "--allow-dirty", *CELL, "--slices", "2"],
    # A bisection's first step: GOOD against BAD, as `ab` (its worktrees, its workers).
    "bisect": ["bisect", "HEAD~1", "HEAD", "--allow-dirty", *CELL, "--slices", "2"],
    "nightly": ["nightly", *CELL, "--rounds", "1"],
    "launch": ["launch", "-n", "2", "--", *CELL],
    # Two plans side by side (harness.orchestrator.pool): a stop reaches the thread waiting on each.
    "plan": ["plan", "--arms", "native,engine", "--preset", "tiny", "--seq", "16", "--batch",
             "8", "--jobs", "2", "--no-plan-cache"],
}
WORKERS = {"plan": 2}
"""Cell workers a command runs at once (1 where not named)."""
CLEANUP_S = 10


def _env(tmp: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", TMPDIR=str(tmp))
    env.pop("XLA_FLAGS", None)
    return env


def _processes_mentioning(marker: str) -> dict[int, str]:
    """Live (non-zombie) processes whose command line or environment names `marker`: pid ->
    name and command line, read in one pass. A process may exit while /proc is read; it is
    skipped, as one that had already gone."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            text = cmdline + (proc / "environ").read_bytes()
            stat = (proc / "stat").read_text()
        except OSError:  # FileNotFoundError or ProcessLookupError: it has just exited
            continue
        name, state = stat.split("(", 1)[1].rsplit(")", 1)[0], stat.rsplit(")", 1)[1].split()[0]
        if marker.encode() in text and state != "Z" and int(proc.name) != os.getpid():
            found[int(proc.name)] = f"{name} {cmdline.decode(errors='replace')}"
    return found


def _is_worker(process: str) -> bool:
    """A cell worker: `python -m harness.cell` (`harness.worker`, an older commit's, as
    `ab` of an older ref runs it), or a child a zygote forked and named."""
    return ("\0harness.cell\0" in process or "\0harness.worker\0" in process
            or process.startswith(WORKER_NAME.decode() + " "))


def _default_sigint():
    """Python ignores SIGINT for good when it starts with SIGINT ignored (as a background
    job of a non-interactive shell does): give the child the default, as a terminal would."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _worktrees() -> str:
    return subprocess.run(["git", "worktree", "list", "--porcelain"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


FAST_STOPS = {("run", signal.SIGTERM), ("run", signal.SIGKILL), ("ab", signal.SIGKILL),
              ("plan", signal.SIGTERM)}
"""The stops `make test` tries (a polite and a hard stop of a run, a hard stop of an A/B's
two refs, a stop of a plan's libtpu processes); the other pairs run with the slow tests
(~5 s each)."""


@pytest.mark.parametrize(("command", "sig"), [
    pytest.param(command, sig, marks=() if (command, sig) in FAST_STOPS else pytest.mark.slow)
    for command, sig in [(command, sig) for command in ("run", "ab") for sig in (
        signal.SIGTERM, signal.SIGKILL, signal.SIGINT)] + [("nightly", signal.SIGINT),
                                                          ("nightly", signal.SIGHUP),
                                                          ("bisect", signal.SIGTERM),
                                                          ("bisect", signal.SIGKILL),
                                                          ("launch", signal.SIGKILL),
                                                          ("plan", signal.SIGINT),
                                                          ("plan", signal.SIGTERM)]],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_a_killed_parent_leaves_no_worker_temp_dir_or_worktree(tmp_path, command, sig):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = ["--history" if command == "nightly" else "--out", str(tmp_path / "out")]
    before = _worktrees()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", *COMMANDS[command], *out],
                            env=_env(tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, preexec_fn=_default_sigint)
    marker = str(tmp)  # the workers' TMPDIR, and so in their command line
    try:
        workers = WORKERS.get(command, 1)
        _wait_for(lambda: sum(_is_worker(process) for process in
                              _processes_mentioning(marker).values()) >= workers, 120,
                  f"{workers} cell workers")
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=CLEANUP_S)
        _wait_for(lambda: not _processes_mentioning(marker), CLEANUP_S,
                  f"every process of the run to exit (left: {list(_processes_mentioning(marker))})")
        _wait_for(lambda: not list(tmp.iterdir()), CLEANUP_S,
                  f"the temp dirs to go (left: {list(tmp.iterdir())})")
        assert _worktrees() == before
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL if sig == signal.SIGKILL else 128 + sig
    if sig != signal.SIGKILL:
        assert "Traceback" not in stderr, stderr
        name = signal.Signals(sig).name
        assert f"({name})" in stderr or f"by {name}" in stderr, stderr
        assert "no cell had finished; no record was written" in stderr
    # No results file is left behind with no record in it, and no lock file.
    assert [p for p in (tmp_path / "out").rglob("*") if p.is_file()] == []


def test_a_parent_killed_during_its_device_probe_takes_the_probe_with_it(tmp_path):
    """The probe (`python -m harness.system.environment`, which starts JAX) dies with a parent
    killed by SIGKILL, at once, rather than running on to its end."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli", "run", *CELL, "--out",
                             str(tmp_path / "out")], env=_env(tmp), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = str(tmp)
    try:
        _wait_for(lambda: any("harness.system.environment" in p for p in
                              _processes_mentioning(marker).values()), 120, "the device probe")
        proc.kill()
        proc.wait(timeout=CLEANUP_S)
        # The kernel kills it with its parent (PR_SET_PDEATHSIG), at once: it had just started
        # (it was seen within 0.1 s of appearing), and starting JAX alone takes it seconds.
        _wait_for(lambda: not _processes_mentioning(marker), 1,
                  f"the probe to exit (left: {list(_processes_mentioning(marker).values())})")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_reaper_cleans_only_what_is_still_registered(tmp_path):
    """The reaper process on its own: a registration taken back is left alone, one still
    held when the parent's pipe closes is killed and removed."""
    keep, remove = tmp_path / "keep", tmp_path / "remove"
    keep.mkdir()
    remove.mkdir()
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    reaper_proc = subprocess.Popen([sys.executable, "-m", "harness.system.reaper"],
                                   stdin=subprocess.PIPE, cwd=REPO, start_new_session=True)
    entries = [{"kind": "path", "path": str(keep)}, {"kind": "path", "path": str(remove)},
               {"kind": "group", "pgid": sleeper.pid}]
    lines = [{"add": e} for e in entries] + [{"remove": entries[0]}]
    reaper_proc.stdin.write("".join(json.dumps(m) + "\n" for m in lines).encode())
    reaper_proc.stdin.close()  # what the parent's death does
    assert reaper_proc.wait(timeout=CLEANUP_S) == 0
    assert sleeper.wait(timeout=CLEANUP_S) == -signal.SIGKILL
    assert keep.exists() and not remove.exists()


def test_terminated_carries_the_shell_exit_code():
    assert reaper.Terminated(signal.SIGTERM).exit_code == 143
    assert reaper.Terminated(signal.SIGHUP).exit_code == 129
    with reaper.terminate_on_signals(), pytest.raises(reaper.Terminated, match="SIGTERM"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL



def test_a_stop_signal_whose_exception_was_swallowed_still_stops_the_run_loop():
    """Python ignores an exception raised in a finalizer or an at-fork hook, so a SIGINT that
    lands there would be lost; the run loop's `raise_if_signalled` raises it again."""
    from harness.system.reaper import Terminated, raise_if_signalled, terminate_on_signals

    for signum, stop in ((signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)):
        with terminate_on_signals():
            raise_if_signalled()  # nothing received yet
            try:  # stands in for the finalizer that swallows the handler's exception
                os.kill(os.getpid(), signum)
                time.sleep(1)
            except stop:
                pass
            with pytest.raises(stop):
                raise_if_signalled()
        raise_if_signalled()  # the block's end forgets it
