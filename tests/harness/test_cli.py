import subprocess
import sys

from harness.cli import main


def test_selftest_prints_counts_loss_and_tunix_parity(capsys):
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    assert "preset tiny: 90,496 parameters" in out
    assert "preset qwen3-0.6b: 596,049,920 parameters" in out
    assert "ragged micro-batches [64, 16, 40, 8]" in out
    assert out.count(" ok\n") == 4
    assert "FAIL" not in out


def test_unknown_preset_is_one_clear_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "selftest", "--preset", "huge"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("parity: error: unknown model preset 'huge'; valid")
    assert "Traceback" not in proc.stderr
