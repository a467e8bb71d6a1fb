"""Our decoder's attention and logits options in a cell: the data and hash of every other cell
unchanged, the refusals (with the fix named) before anything is built, and the chunked loss
taken by every arm on our decoder."""

import re

import numpy as np
import pytest

from arms.base import check_model
from arms.registry import make_arm
from arms.spec import CellSpec
from arms.workload import exact_loss_and_gradient, rel_l2
from engine.model import build_decoder
from reports.parity import GRAD_TOLERANCE

SCHEMA_9_KEYS = {"preset", "seq", "batch", "ga", "dtype", "mesh", "loss", "z_loss",
                 "optimizer", "learning_rate", "clip", "ragged", "mask_fraction", "seed",
                 "scan_layers", "remat"}
"""A default cell's data before these options existed (records of schema 9)."""


def test_unset_options_leave_every_other_cells_data_and_hash_as_it_was():
    assert set(CellSpec().to_dict()) == SCHEMA_9_KEYS
    # blocks only where a kernel reads them; the XLA attention reads none
    assert set(CellSpec(attention_block_q=256).to_dict()) == SCHEMA_9_KEYS
    splash = CellSpec(seq=1024, attention="splash").to_dict()
    assert {k: splash[k] for k in ("attention", "attention_block_q", "attention_block_kv")} == {
        "attention": "splash", "attention_block_q": 512, "attention_block_kv": 1024}
    chunked = CellSpec(seq=64, logits_chunk=16)
    assert chunked.to_dict()["logits_chunk"] == 16
    assert CellSpec.from_dict(chunked.to_dict()) == chunked
    config = CellSpec(seq=4096, attention="auto", attention_block_q=1024,
                      logits_chunk=512).model_config()
    assert (config.attention, config.attention_block_q, config.attention_block_kv,
            config.logits_chunk) == ("auto", 1024, 1024, 512)


@pytest.mark.parametrize(("options", "message"), [
    ({"seq": 1000, "attention": "splash"}, "attention_block_q=512 does not divide seq 1000"),
    ({"seq": 64, "logits_chunk": 48}, "logits_chunk=48 does not divide seq 64"),
    ({"loss": "tunix-grpo", "batch": 4, "seq": 64, "logits_chunk": 16},
     "Tunix's grpo_loss_fn takes the model's whole logits.*Pass --logits-chunk 0"),
    ({"attention": "flash"}, "attention='flash'; valid: 'xla', 'splash', 'auto'"),
])
def test_options_a_cell_cannot_take_are_refused_naming_the_fix(options, message):
    with pytest.raises(ValueError, match=message):
        CellSpec(**options)


@pytest.mark.parametrize("model", ["maxtext", "tunix"])
def test_other_models_refuse_our_kernels_and_take_auto(model):
    full = {"remat": "full"}
    with pytest.raises(ValueError, match="--attention splash is our decoder's Pallas kernel"):
        check_model(model, CellSpec(seq=1024, attention="splash", **full))
    with pytest.raises(ValueError, match="--logits-chunk 16 chunks our decoder's head"):
        check_model(model, CellSpec(seq=64, logits_chunk=16, **full))
    check_model(model, CellSpec(seq=4096, attention="auto", **full))


def _largest_f32(executables) -> int:
    sizes = [int(np.prod([int(n) for n in shape.split(",")]))
             for compiled in executables.values()
             for shape in re.findall(r"f32\[([0-9,]+)\]", compiled.as_text()) if shape]
    return max(sizes)


def test_every_arm_on_our_decoder_takes_the_chunked_loss(devices):
    """Each arm's compiled step holds no float32 array as large as the [B, L, V] logits
    (tiny: 8 x 32 x 256; the largest other float32 arrays are half that), and its loss and
    gradient are the whole-logits reference's (the tolerances of test_arms)."""
    spec = CellSpec(preset="tiny", seq=32, batch=8, logits_chunk=8, mask_fraction=0.5)
    reference = build_decoder(spec.model_config().plain(), seed=spec.seed)
    ref_loss, ref_grad = exact_loss_and_gradient(reference, spec.micro_batches(),
                                                 spec.loss_fn())
    logits = spec.batch * spec.seq * spec.model_config().vocab_size
    for name in ("engine", "engine-fused", "native", "peft-decoder"):
        arm = make_arm(name, spec)
        arm.build()
        arm.step(arm.place(spec.micro_batches()))
        loss, grad = arm.last_loss(), arm.seen_gradient()
        assert _largest_f32(arm.executables()) < logits, name
        arm.close()
        assert abs(loss - ref_loss) <= 1e-5 * abs(ref_loss), name
        assert rel_l2(grad, ref_grad) <= GRAD_TOLERANCE, name
