"""A cell's gradient parity: the gradient the first step's optimizer saw against the exact
sum/sum reference, computed once per (model, weights, data, dtype) and kept in the reference
store (harness.cell.reference_store) for every arm of the shape and every later run.

The check runs after every measurement of the cell, once the arm's device buffers are
released, one micro-batch at a time (arms.workload.exact_by_micro_batch), so it needs the
device memory of one micro-batch's forward and backward pass beside nothing of the arm's.
Whatever it does (runs out of memory, raises), the cell keeps what it measured and records
why the check gave no verdict (`checked_parity`). Its cost is recorded: the seconds this
cell spent getting the reference (`Parity.reference_s`: computing it, or reading it back)
and what computing it took (`Parity.reference_computed_s`).

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
import time

from harness.cell.reference_store import Entry, ReferenceStore, reference_key
from harness.contract import OOM_MARKERS, REFERENCE_DIR
from reports.record import Parity

DEFAULT, HIGHEST = "default", "highest"
"""JAX's matmul precisions the references are computed at."""


def exact_arithmetic(dtype: str, backend: str) -> bool:
    """Whether work of `dtype` on `backend` multiplies exactly in float32 (the CPU backend's
    default precision is float32; an accelerator's rounds float32 inputs)."""
    return dtype == "float32" and backend == "cpu"


def checked_parity(spec, gradient, first_loss: float, trainer_denominator: float | None
                   ) -> tuple[Parity | None, str | None]:
    """(parity, None), or (None, why it gave no verdict: 'oom: ...' where the check ran out
    of memory, 'exception: ...' for any other error). Never raises for the check itself."""
    try:
        return parity_section(spec, gradient, first_loss, trainer_denominator), None
    except Exception as err:  # kept as the record's reason; the measurements stand
        return None, why_not_checked(err)


def why_not_checked(err: Exception) -> str:
    """A check's error as the record's reason: 'oom: ...' where it ran out of memory,
    'exception: ...' for any other."""
    message = f"{type(err).__name__}: {err}"
    reason = "oom" if any(m in message for m in OOM_MARKERS) else "exception"
    return f"{reason}: {message[:600]}"


def parity_section(spec, gradient, first_loss: float, trainer_denominator: float | None
                   ) -> Parity:
    """The first step's gradient (as the arm's optimizer saw it, on the host in our
    decoder's layout) vs the exact sum/sum reference, by the precision rule (module
    docstring). `trainer_denominator`: what the arm's trainer divided by
    (Arm.trainer_denominator; every step of a cell runs the same micro-batches, so any
    step's is the first's)."""
    from arms.workload import data_digest, denominators, rel_l2
    from arms.workload.reference import distances, relative

    started = time.perf_counter()
    batches = spec.micro_batches(0)
    dens = denominators(batches, spec.loss_fn())
    entry, stored = exact_reference(spec, batches)
    reference_s = time.perf_counter() - started
    # One pass over the gradient for every reference the entry holds.
    held = {name: tree for name, tree in (("exact", entry.gradient),
                                          ("mean_of_means", entry.mean_of_means),
                                          ("exact32", entry.exact32)) if tree is not None}
    grad_l2, found = distances(gradient, list(held.values()))
    away = dict(zip(held, found, strict=True))
    rels = {name: relative(diff, norm) for name, (norm, diff) in away.items()}
    predicted = (None if entry.mean_of_means is None
                 else rel_l2(entry.mean_of_means, entry.gradient))
    return Parity(
        data_digest=data_digest(batches), denominators=dens, denominator=sum(dens),
        trainer_denominator=trainer_denominator, loss=first_loss, exact_loss=entry.loss,
        loss_rel_error=(abs(first_loss - entry.loss) / abs(entry.loss) if entry.loss
                        else None),
        grad_l2=grad_l2, exact_grad_l2=away["exact"][0], rel_l2=rels["exact"],
        tied_head=spec.model_config().tie_embeddings,
        reference_shared=stored, floor_rel_l2=entry.floor_rel_l2,
        reference_s=reference_s, reference_computed_s=entry.computed_s,
        mean_of_means_rel_l2=rels.get("mean_of_means"), predicted_rel_l2=predicted,
        float32_rel_l2=rels.get("exact32"))


def stack() -> dict:
    """What a reference's arithmetic depends on besides the work: the backend, its device
    kind and the package versions (harness.system.environment.versions)."""
    import jax

    from harness.system.environment import versions

    return {"backend": jax.default_backend(), "device_kind": jax.devices()[0].device_kind,
            "versions": versions()}


def exact_reference(spec, batches) -> tuple[Entry, bool]:
    """(the exact reference of `spec` in its own arithmetic with its floor, whether it was
    read from the store at $PARITY_REFERENCE_DIR). Computed where not stored: at the default
    matmul precision in the cell's dtype, and, where that arithmetic rounds, again in exact
    float32 (the floor is the distance between the two; both are kept, so each arm's own
    distance from exact float32 is said too)."""
    import jax

    from arms.workload import data_digest, rel_l2

    directory = os.environ.get(REFERENCE_DIR)
    store = ReferenceStore(directory) if directory else None
    key = reference_key({**spec.to_dict(), "data": data_digest(batches)}, DEFAULT, stack())
    entry = store.read(key) if store is not None else None
    if entry is not None:
        return entry, True
    start = time.perf_counter()
    model = _reference_model(spec)
    found = _compute_reference(spec, batches, DEFAULT, model)
    floor = exact32 = None
    if not exact_arithmetic(spec.dtype, jax.default_backend()):
        spec32 = dataclasses.replace(spec, dtype="float32")
        exact32 = _compute_reference(spec32, batches, HIGHEST,
                                     _reference_model(spec32, like=model)).exact
        floor = rel_l2(found.exact, exact32)
    del model
    entry = Entry(loss=found.loss, gradient=found.exact, mean_of_means=found.mean_of_means,
                  exact32=exact32, floor_rel_l2=floor,
                  computed_s=time.perf_counter() - start)
    if store is not None:
        store.write(key, entry)
    return entry, False


def _reference_model(spec, like=None):
    """Our decoder of `spec` on one local device: initialized (where the arm ran on that
    same one-device mesh, its compiled initializer is reused: same weights, no second
    compile), or holding the very arrays of `like` (the same weights in another compute
    dtype: a float32 reference beside a bfloat16 one needs no initializer of its own,
    whose compile took 30 s on the TPU v5e host)."""
    import jax
    from flax import nnx

    from engine.model import Decoder, build_decoder, make_mesh

    config = spec.model_config().plain()  # XLA attention, whole logits: what any arm runs
    if like is None:
        one_device = make_mesh("", devices=jax.local_devices()[:1])
        return build_decoder(config, seed=spec.seed, mesh=one_device)
    graph = nnx.split(nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(spec.seed))))[0]
    return nnx.merge(graph, nnx.state(like))


def _compute_reference(spec, batches, precision: str, model):
    """The references of `spec` on `batches` at matmul `precision`, by `model`
    (arms.workload.reference.References)."""
    import jax

    from arms.workload.reference import references_by_micro_batch

    with jax.default_matmul_precision(precision):
        return references_by_micro_batch(model, batches, spec.loss_fn())
