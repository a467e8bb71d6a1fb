"""A cell's gradient parity: the first step's captured gradient against the exact sum/sum
reference, computed once per spec in a run and shared through REFERENCE_DIR. A cell whose
compute dtype is below float32 also gets the same reference in float32, and the distance
between the two (the dtype's floor) sizes its tolerance (reports.parity.tolerance)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from harness.contract import REFERENCE_DIR, reference_file
from reports.record import Parity


def parity_section(spec, captured, first_loss: float, trainer_denominator: float | None
                   ) -> Parity:
    """The first step's captured gradient vs the exact sum/sum reference (computed last, so
    its memory never pollutes the measured peaks). `trainer_denominator`: what the arm's
    trainer divided by (Arm.trainer_denominator; every step of a cell runs the same
    micro-batches, so any step's is the first's)."""
    from arms.workload import data_digest, denominators, global_norm, rel_l2

    batches = spec.micro_batches(0)
    dens = denominators(batches, spec.loss_fn())
    exact_loss, exact, shared = _exact_reference(spec, batches)
    floor = None
    if spec.dtype != "float32":  # how far the dtype's own arithmetic puts the reference
        _, exact32, _ = _exact_reference(dataclasses.replace(spec, dtype="float32"), batches)
        floor = rel_l2(exact, exact32)
    return Parity(
        data_digest=data_digest(batches), denominators=dens, denominator=sum(dens),
        trainer_denominator=trainer_denominator, loss=first_loss, exact_loss=exact_loss,
        loss_rel_error=abs(first_loss - exact_loss) / abs(exact_loss) if exact_loss else None,
        grad_l2=global_norm(captured), exact_grad_l2=global_norm(exact),
        rel_l2=rel_l2(captured, exact), tied_head=spec.model_config().tie_embeddings,
        reference_shared=shared, floor_rel_l2=floor)


def _exact_reference(spec, batches) -> tuple[float, dict, bool]:
    """(exact loss, exact gradient as a pure dict, whether it was read from the run's
    reference store). The reference depends only on the spec (weights, data, loss), which
    every arm of a shape shares, so the first cell of a shape computes it and writes it to
    $PARITY_REFERENCE_DIR/<cell hash>.msgpack (whole, by rename); the others read it."""
    from flax import serialization

    directory = os.environ.get(REFERENCE_DIR)
    path = Path(reference_file(directory, spec.to_dict())) if directory else None
    if path is not None and path.exists():
        stored = serialization.msgpack_restore(path.read_bytes())
        return float(stored["loss"]), stored["gradient"], True
    exact_loss, exact = _compute_reference(spec, batches)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.partial")
        partial.write_bytes(serialization.msgpack_serialize(
            {"loss": exact_loss, "gradient": exact}))
        partial.replace(path)
    return exact_loss, exact, False


def _compute_reference(spec, batches) -> tuple[float, dict]:
    import jax
    from flax import nnx

    from arms.workload import exact_loss_and_gradient
    from engine.model import build_decoder, make_mesh

    # On one local device; where the arm ran on that same one-device mesh, its compiled
    # initializer is reused (same weights, no second compile).
    one_device = make_mesh("", devices=jax.local_devices()[:1])
    reference = build_decoder(spec.model_config(), seed=spec.seed, mesh=one_device)
    exact_loss, exact = exact_loss_and_gradient(reference, batches, spec.loss_fn())
    return exact_loss, jax.device_get(nnx.to_pure_dict(exact))

