"""Every arm planned for TPU7x through its own code path, read back by report and compare
(slow: a TPU compile of each arm's step, ~15-30 s each on 2 cores)."""

import pathlib
import subprocess
import sys

import pytest

from arms.registry import NAMED_ARMS
from arms.spec import CellSpec
from harness.measure.flops import compiled_matmul_flops
from reports.record import read_dir
from tests.harness.cli.test_cli_plan import REPO, plan, plan_arms

pytestmark = pytest.mark.slow

SHAPE = ["--preset", "tiny-untied", "--seq", "16", "--batch", "16", "--ga", "2", "--mesh",
         "fsdp=8", "--scan-layers", "--remat", "full"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans")
    return out, plan_arms(out, list(NAMED_ARMS), *SHAPE)


def test_every_arm_plans_through_its_own_step(planned):
    _, records = planned
    assert set(records) == set(NAMED_ARMS)
    for arm, record in records.items():
        p = record.plan
        assert record.ok and p.device_kind == "TPU7x" and p.device_count == 8, arm
        assert p.fits and p.hbm_capacity_bytes > 2**35  # tens of GiB per TPU7x device
        running = {n: e for n, e in p.executables.items() if e.calls_per_step}
        assert p.peak_executable in running
        # The peak is the largest running executable's footprint plus what it leaves out.
        assert p.planned_peak_bytes == max(e.argument + e.output + e.temp - e.alias
                                           + e.held_bytes for e in running.values())
        assert p.planned_peak_bytes >= p.resident_bytes["params"] > 0
        # fsdp=8: every step gathers weights and reduces gradients.
        assert p.collective_bytes_per_step["all-gather"] > 0, arm
        assert p.hbm_bytes_per_step > 0 and p.flops_per_step > 0
    # The matmuls every arm's model does, to the FLOP: attention unmasked, each layer's
    # forward again less its down projection (full remat), the head once (fsdp=8: an eighth
    # per device).
    config = CellSpec.from_dict(records["native"].spec.__dict__)
    predicted = compiled_matmul_flops(config.model_config(), batch=config.batch,
                                      seq=config.seq, remat="full")
    assert {arm: r.plan.flops_per_step * 8 for arm, r in records.items()} == dict.fromkeys(
        records, predicted)
    # Calls per step at GA 2: the PeftTrainer arms run their step per micro-batch.
    assert records["peft-decoder"].plan.executables["train_step"].calls_per_step == 2
    assert records["engine"].plan.executables["fwd_bwd_accumulate"].calls_per_step == 1
    assert records["maxtext-engine"].plan.executables["fwd_bwd_accum"].calls_per_step == 1
    # One single-jit step each: nothing of the train state waits outside it.
    for arm in ("native", "engine-fused"):
        assert all(e.held_bytes == 0 for e in records[arm].plan.executables.values())


def test_tunix_qwen3_is_planned_with_its_tpu_activation_sharding(planned):
    """Tunix's Qwen3 constrains its activations' batch dimension to the batch axes on a TPU
    (on CPU it constrains nothing). Planned for TPU7x it is traced as on the TPU: FSDP over
    the batch as our decoder under the same trainer, so the weights gathered and the
    gradients reduce-scattered are the same bytes, and only scalars (loss, norms) are
    all-reduced beyond the decoder's. Traced with Tunix's CPU rule instead, the batch is
    replicated on every device and each layer's activations are all-reduced (at this shape:
    2,320,948 all-reduced bytes a step against 693,658)."""
    _, records = planned
    tunix = records["peft-tunix"].plan.collective_bytes_per_step
    decoder = records["peft-decoder"].plan.collective_bytes_per_step
    for kind in ("all-gather", "reduce-scatter", "all-to-all"):
        assert tunix[kind] == decoder[kind], kind
    # One layer's activation of one row is 16 x 64 x 4 bytes here (4 KiB): above anything
    # scalar reductions add (98 bytes at this shape).
    assert abs(tunix["all-reduce"] - decoder["all-reduce"]) < 1024, (tunix, decoder)


def test_the_report_has_a_plan_section_with_a_peak_chart(planned, tmp_path):
    out, records = planned
    proc = subprocess.run([sys.executable, "-m", "harness.cli", "report", str(out), "-o",
                           str(tmp_path / "parity.md"), "--baseline-arm", "native"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "parity.md").read_text()
    assert "### Plan on tpu7x:2x2x1" in text
    for arm in records:
        assert f"| {arm} |" in text
    assert "(1.00x)" in text  # native against itself
    assert (tmp_path / "plan0_peak.png").stat().st_size > 10_000
    assert "### Summary" not in text  # no timing: no timing sections


def test_a_planted_replicated_gradient_is_a_regression_in_compare(planned, tmp_path):
    """The same `native` cell with every gradient replicated before the optimizer: XLA
    all-reduces the gradients where it reduce-scattered them (twice the bytes on the
    interconnect), and compare fails on the collective bytes."""
    out, records = planned
    proc = plan("--plugin", "tests.harness.cell.planted", "--arms", "native", *SHAPE,
                "--out", str(tmp_path), timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (planted,) = read_dir(tmp_path)
    before = records["native"].plan.collective_bytes_per_step
    after = planted.plan.collective_bytes_per_step
    assert after["reduce-scatter"] < before["reduce-scatter"]
    assert after["all-reduce"] > before["all-reduce"]
    assert sum(after.values()) > sum(before.values())
    compare = subprocess.run([sys.executable, "-m", "harness.cli", "compare", str(out),
                              str(tmp_path), "--fail-on-regression"], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    assert compare.returncode == 1, compare.stdout + compare.stderr
    assert "cost plan_collective_bytes_per_step" in compare.stderr
    assert "cost plan_all_reduce_bytes_per_step" in compare.stderr
    assert "native tiny-untied" in compare.stderr
    same = subprocess.run([sys.executable, "-m", "harness.cli", "compare", str(out), str(out),
                           "--fail-on-regression"], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert same.returncode == 0, same.stderr  # a plan against itself: no change at all
    assert "plan (exact)" in same.stdout


def test_a_cell_that_cannot_fit_is_oom_and_the_suite_exits_1(tmp_path):
    """A suite of two cells on one TPU7x device, one of whose attention scores alone need
    more HBM than the device has: that cell is recorded `oom` with the compiler's words,
    the other plans, and `plan --suite` exits 1 naming the one that does not fit."""
    suite = tmp_path / "too-big.toml"
    suite.write_text('arms = ["native"]\npreset = "tiny"\nseq = [64, 8192]\nbatch = [64]\n'
                     'ga = [1]\nremat = "full"\ntarget = "tpu7x:2x2x1"\n')
    proc = plan("--suite", str(suite), "--out", str(tmp_path / "out"), timeout=900)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "native tiny seq=8192 batch=64 ga=1: oom:" in proc.stderr
    assert "seq=64 " not in proc.stderr
    records = {r.spec.seq: r for r in read_dir(tmp_path / "out")}
    assert records[64].ok and records[64].plan.fits
    assert records[8192].error.reason == "oom"
    assert "exceeds available HBM" in records[8192].error.message
    assert pathlib.Path(tmp_path / "out").is_dir()


def test_an_executable_no_step_calls_is_not_compiled(tmp_path):
    """MaxText's engine lowers its accumulating kernel at GA 1 too, with 0 calls per step:
    it adds nothing to a step's figures, so the planner does not compile it."""
    ga1 = [*SHAPE]
    ga1[ga1.index("--ga") + 1] = "1"
    records = plan_arms(tmp_path, ["maxtext-engine"], *ga1)
    p = records["maxtext-engine"].plan
    assert set(p.executables) == {"fwd_bwd", "update"}
    assert {n: e.calls_per_step for n, e in p.executables.items()} == {"fwd_bwd": 1, "update": 1}
