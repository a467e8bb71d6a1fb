"""harness.orchestrator.environment: a run that finds the accelerator held by another
process says so in one line naming that process, or waits for it."""

import subprocess
import sys

import pytest

from harness.cli import main
from harness.orchestrator import environment
from harness.orchestrator.environment import DeviceHeldError, held_message, holder

# What libtpu prints when a second process opens a TPU another holds (seen on the v5e host,
# ../shared/tpu-host/README.md, in the traceback `parity run` printed there).
LIBTPU_SAYS = ("RuntimeError: Unable to initialize backend 'tpu': ABORTED: The TPU is already "
               "in use by process with pid 4242. Not attempting to load libtpu.so in this "
               "process.")


def test_the_holder_is_read_from_libtpu_s_words():
    assert holder(f"Traceback (most recent call last):\n...\n{LIBTPU_SAYS}\n") == 4242
    assert holder("RuntimeError: Unable to initialize backend 'cuda'") is None


def test_the_message_names_the_holding_process_and_what_to_do():
    code = "print('up', flush=True); import time; time.sleep(30)"
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                          text=True) as sleeper:
        try:
            assert sleeper.stdout.readline() == "up\n"  # its command line is its own now
            line = held_message(sleeper.pid, waited_s=0)
        finally:
            sleeper.kill()
    assert line.startswith(f"the TPU is held by process {sleeper.pid} ({sys.executable} -c "
                           f"{code}); only one process may open it"), line
    assert f"kill {sleeper.pid}" in line and "--wait-for-device SECONDS" in line
    assert "\n" not in line
    gone = held_message(2**22 + 1, waited_s=30)  # no such process: named by its pid alone
    assert gone.startswith(f"the TPU is held by process {2**22 + 1} after waiting 30 s;")


def test_a_held_device_ends_the_command_with_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                  capsys):
    """The probe's libtpu refusal (its output as a held chip's probe prints it) becomes the
    command's one-line error, after waiting as long as --wait-for-device says, and nothing
    is written."""
    calls = []

    def held_probe(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 1, stdout="", stderr=LIBTPU_SAYS)

    monkeypatch.setattr(environment.subprocess, "run", held_probe)
    monkeypatch.setattr(environment, "POLL_S", 0.01)
    code = main(["run", "--arms", "native", "--preset", "tiny", "--out", str(tmp_path),
                 "--wait-for-device", "0.05"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("parity: error: the TPU is held by process 4242")
    assert "after waiting 0 s" in err[0] and len(calls) >= 2  # probed again while waiting
    assert not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="--wait-for-device -1"):
        from harness.grid.options import check

        check({"wait_s": -1})
    assert issubclass(DeviceHeldError, ValueError)
