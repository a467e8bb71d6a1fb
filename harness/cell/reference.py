"""A cell's gradient parity: the first step's captured gradient against the exact sum/sum
reference, computed once per spec in a run and shared through REFERENCE_DIR.

The check runs after every measurement of the cell, once the arm's device buffers are
released, one micro-batch at a time (arms.workload.exact_by_micro_batch), so it needs the
device memory of one micro-batch's forward and backward pass beside nothing of the arm's.
Whatever it does (runs out of memory, raises), the cell keeps what it measured and records
why the check gave no verdict (`checked_parity`).

The precision rule. The exact reference is float32 at `Precision.HIGHEST`: true float32
matmuls on every backend. A cell whose own arithmetic is exact float32 (float32 work on the
CPU) is compared with it directly, held to reports.parity.GRAD_TOLERANCE. Any other cell
rounds at every matmul: bfloat16 work anywhere, and float32 work on an accelerator, whose
default matmul precision rounds float32 inputs (a TPU multiplies them in one bfloat16 pass,
a recent NVIDIA GPU in TF32). Such a cell is compared with the reference computed in its own
arithmetic (its dtype at the default precision, as every arm runs), and its tolerance is that
reference's distance from the exact float32 one (`Parity.floor_rel_l2`): the whole rounding
error of the arithmetic on this gradient, which a trainer doing the same work in it stays
well inside and doing other work (a mean of micro-batch means) exceeds.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from harness.contract import OOM_MARKERS, REFERENCE_DIR, reference_file
from harness.store.results import write_whole
from reports.record import Parity

DEFAULT, HIGHEST = "default", "highest"
"""JAX's matmul precisions the references are computed at."""


def exact_arithmetic(dtype: str, backend: str) -> bool:
    """Whether work of `dtype` on `backend` multiplies exactly in float32 (the CPU backend's
    default precision is float32; an accelerator's rounds float32 inputs)."""
    return dtype == "float32" and backend == "cpu"


def checked_parity(spec, captured, first_loss: float, trainer_denominator: float | None
                   ) -> tuple[Parity | None, str | None]:
    """(parity, None), or (None, why it gave no verdict: 'oom: ...' where the check ran out
    of memory, 'exception: ...' for any other error). Never raises for the check itself."""
    try:
        return parity_section(spec, captured, first_loss, trainer_denominator), None
    except Exception as err:  # kept as the record's reason; the measurements stand
        message = f"{type(err).__name__}: {err}"
        reason = "oom" if any(m in message for m in OOM_MARKERS) else "exception"
        return None, f"{reason}: {message[:600]}"


def parity_section(spec, captured, first_loss: float, trainer_denominator: float | None
                   ) -> Parity:
    """The first step's captured gradient vs the exact sum/sum reference, by the precision
    rule (module docstring). `trainer_denominator`: what the arm's trainer divided by
    (Arm.trainer_denominator; every step of a cell runs the same micro-batches, so any
    step's is the first's)."""
    import jax

    from arms.workload import data_digest, denominators, rel_l2
    from arms.workload.reference import norms, relative

    batches = spec.micro_batches(0)
    dens = denominators(batches, spec.loss_fn())
    exact_loss, exact, shared = _exact_reference(spec, batches, DEFAULT)
    floor = None
    if not exact_arithmetic(spec.dtype, jax.default_backend()):
        _, exact32, _ = _exact_reference(dataclasses.replace(spec, dtype="float32"), batches,
                                         HIGHEST)
        floor = rel_l2(exact, exact32)
    grad_l2, exact_l2, diff_l2 = norms(captured, exact)
    return Parity(
        data_digest=data_digest(batches), denominators=dens, denominator=sum(dens),
        trainer_denominator=trainer_denominator, loss=first_loss, exact_loss=exact_loss,
        loss_rel_error=abs(first_loss - exact_loss) / abs(exact_loss) if exact_loss else None,
        grad_l2=grad_l2, exact_grad_l2=exact_l2,
        rel_l2=relative(diff_l2, exact_l2),
        tied_head=spec.model_config().tie_embeddings,
        reference_shared=shared, floor_rel_l2=floor)


def _exact_reference(spec, batches, precision: str) -> tuple[float, dict, bool]:
    """(exact loss, exact gradient as a pure dict, whether it was read from the run's
    reference store), computed at matmul `precision`. The reference depends only on the
    spec (weights, data, loss) and the precision, which every arm of a shape shares, so the
    first cell of a shape computes it and writes it to
    $PARITY_REFERENCE_DIR/<cell hash>-<precision>.msgpack (whole, by rename); the others
    read it."""
    from flax import serialization

    directory = os.environ.get(REFERENCE_DIR)
    path = (Path(reference_file(directory, spec.to_dict(), precision)) if directory
            else None)
    if path is not None and path.exists():
        stored = serialization.msgpack_restore(path.read_bytes())
        return float(stored["loss"]), stored["gradient"], True
    exact_loss, exact = _compute_reference(spec, batches, precision)
    if path is not None:
        write_whole(path, serialization.msgpack_serialize(
            {"loss": exact_loss, "gradient": exact}))
    return exact_loss, exact, False


def _compute_reference(spec, batches, precision: str) -> tuple[float, dict]:
    import jax

    from arms.workload import exact_by_micro_batch
    from engine.model import build_decoder, make_mesh

    # On one local device; where the arm ran on that same one-device mesh, its compiled
    # initializer is reused (same weights, no second compile).
    one_device = make_mesh("", devices=jax.local_devices()[:1])
    with jax.default_matmul_precision(precision):
        # The plain computation (XLA attention, whole logits), whatever kernel the arm runs.
        reference = build_decoder(spec.model_config().plain(), seed=spec.seed,
                                  mesh=one_device)
        return exact_by_micro_batch(reference, batches, spec.loss_fn())
