import subprocess
import sys

from harness.cli import main


def test_selftest_prints_counts_loss_and_three_model_parity(capsys):
    assert main(["selftest"]) == 0
    out = capsys.readouterr().out
    assert "preset tiny: 90,496 parameters" in out
    assert "preset qwen3-0.6b: 596,049,920 parameters" in out
    assert "ragged micro-batches [64, 16, 40, 8]" in out
    # 8 variants (tied/untied x scanned x packed): decoder vs Tunix in each; untied also
    # decoder vs MaxText and MaxText vs Tunix; tied the bf16-head proof of MaxText's gap.
    assert out.count(" ok\n") == 8 + 4 * 2 + 4
    assert out.count("MaxText vs decoder with bf16-rounded head") == 4
    assert out.count("casts the embedding to bfloat16") == 8
    assert "FAIL" not in out


def test_unknown_preset_is_one_clear_line_and_exit_2():
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "selftest", "--preset", "huge"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("parity: error: unknown model preset 'huge'; valid")
    assert "Traceback" not in proc.stderr
