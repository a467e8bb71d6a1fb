"""Model FLOPs (harness.measure.flops) against MaxText's own formula."""

import pytest

from arms.models.maxtext_qwen3 import maxtext_config
from engine.model import get_preset
from harness.measure.flops import model_flops, model_flops_per_step

# ------------------------------------------------------------------------- model FLOPs
DEVICES = 8
"""MaxText counts per device for per_device_batch_size rows; the conftest's 8 CPU devices all
hold batch (fsdp=8), so the step's rows are per_device_batch_size * 8."""


@pytest.mark.maxtext
@pytest.mark.parametrize("preset", ["tiny", "small", "qwen3-0.6b"])
def test_model_flops_equal_maxtexts_formula_over_all_devices(preset):
    from maxtext.utils.maxtext_utils import calculate_tflops_training_per_device

    config, per_device_batch, seq = get_preset(preset, remat="full"), 2, 64
    mx = maxtext_config(config, mesh_shape={"fsdp": DEVICES}, seq=seq,
                        per_device_batch_size=per_device_batch)
    batch = per_device_batch * DEVICES
    assert mx.global_batch_size_to_train_on == batch  # the mapping MaxText itself uses
    total_tflops, weight_tflops, attention_tflops = calculate_tflops_training_per_device(
        mx, log=False)
    ours = model_flops(config, batch=batch, seq=seq)
    # rel 1e-6: both are the same closed form; only float rounding of MaxText's /1e12 differs.
    assert ours.weights == pytest.approx(weight_tflops * 1e12 * DEVICES, rel=1e-6)
    assert ours.attention == pytest.approx(attention_tflops * 1e12 * DEVICES, rel=1e-6)
    assert model_flops_per_step(config, batch=batch, seq=seq) == pytest.approx(
        total_tflops * 1e12 * DEVICES, rel=1e-6)


def test_model_flops_ignore_scan_and_remat_and_scale_linearly_in_batch():
    base = model_flops_per_step(get_preset("small"), batch=4, seq=128)
    for scan_layers in (False, True):
        for remat in ("none", "full"):
            config = get_preset("small", scan_layers=scan_layers, remat=remat)
            assert model_flops_per_step(config, batch=4, seq=128) == base
    assert model_flops_per_step(get_preset("small"), batch=12, seq=128) == 3 * base
    # Attention is quadratic in seq, so doubling seq more than doubles the count.
    assert model_flops_per_step(get_preset("small"), batch=4, seq=256) > 2 * base
    with pytest.raises(ValueError, match="positive"):
        model_flops_per_step(get_preset("small"), batch=0, seq=128)


def test_model_flops_by_hand_for_tiny():
    # tiny: V=256 D=64 layers=2 N=4 K=2 H=16 F=128; batch 1 x seq 8 tokens.
    tokens, seq = 8, 8
    per_layer = (2 * tokens * 128 * 64 * 3            # SwiGLU: wi_0, wi_1, wo
                 + 2 * tokens * 64 * (4 + 2 * 2) * 16  # q, k, v
                 + 2 * tokens * 64 * 4 * 16)           # attention out
    weights = 3 * (2 * per_layer + 2 * tokens * 64 * 256)  # + unembedding, x3 fwd+bwd
    attention = 3 * 2 * (4 * seq * seq * 4 * 16 / 2)       # causal half, x3, 2 layers
    flops = model_flops(get_preset("tiny"), batch=1, seq=seq)
    assert (flops.weights, flops.attention, flops.total) == (weights, attention,
                                                            weights + attention)


# --------------------------------------------------------------- compiled matmul FLOPs
@pytest.mark.parametrize(("scan_layers", "remat"), [
    (True, "none"), (False, "full"),  # each value of each once; the other pairs slow
    pytest.param(False, "none", marks=pytest.mark.slow),
    pytest.param(True, "full", marks=pytest.mark.slow)])
def test_a_compiled_steps_matmul_flops_are_the_remat_prediction(remat, scan_layers):
    """`native`'s step compiled for the conftest's 8 CPU devices (fsdp=8: every device does
    an eighth of the work) does exactly the matmul FLOPs `compiled_matmul_flops` predicts:
    unmasked attention, and with full remat each layer's forward again less its down
    projection (dead code). Counted from the optimized HLO, loops as they run."""
    from arms.registry import make_arm
    from arms.spec import CellSpec
    from harness.measure.flops import compiled_matmul_flops
    from harness.xla import counts

    spec = CellSpec(preset="tiny-untied", seq=32, batch=16, ga=2, mesh="fsdp=8",
                    scan_layers=scan_layers, remat=remat)
    arm = make_arm("native", spec)
    arm.build()
    (compiled,) = arm.executables().values()
    per_device = counts.costs(compiled.as_text()).flops
    arm.close()
    assert per_device * DEVICES == compiled_matmul_flops(spec.model_config(), batch=spec.batch,
                                                         seq=spec.seq, remat=remat)
    assert compiled_matmul_flops(spec.model_config(), batch=8, seq=32, remat="minimal") is None
