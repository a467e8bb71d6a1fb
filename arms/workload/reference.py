"""The exact reference gradient and the pytree distance every parity number is quoted in."""

from __future__ import annotations

import concurrent.futures
import os
from collections.abc import Sequence
from typing import NamedTuple

import jax
import numpy as np
from flax import nnx

from arms.workload.batches import MicroBatch, denominators
from arms.workload.losses import LossFn
from engine.model import run_once_options


def exact_loss_and_gradient(model: nnx.Module, micro_batches: Sequence[MicroBatch],
                            loss: LossFn) -> tuple[float, nnx.State]:
    """(sum_i loss_sum_i / sum_i den_i, its gradient w.r.t. the model's Params).

    One differentiated function over all micro-batches: no accumulator, no per-micro-batch
    normalization, nothing an engine could share a bug with. Denominators do not depend on
    the parameters, so the gradient is sum_i grad(loss_sum_i) / sum_i den_i exactly.
    """
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    def objective(params):
        merged = nnx.merge(graph, params, rest)
        outputs = [loss(merged, mb) for mb in micro_batches]
        total = sum(o.loss_sum for o in outputs)
        denominator = sum(o.denominator for o in outputs)
        return total / denominator

    # It runs once: engine.model.run_once_options (on CPU, no LLVM optimization).
    value, grads = jax.jit(jax.value_and_grad(objective),
                           compiler_options=run_once_options())(params)
    return float(value), grads


class References(NamedTuple):
    """What `references_by_micro_batch` computes, on the host."""

    loss: float
    """sum_i loss_sum_i / sum_i den_i."""
    exact: dict
    """Its gradient, sum_i grad(loss_sum_i) / sum_i den_i (float32 numpy, pure dict)."""
    mean_of_means: dict | None
    """(1/n) sum_i grad(loss_sum_i) / den_i: the gradient a trainer averaging micro-batch
    mean losses computes (optax.MultiSteps over mean losses, PeftTrainer's accumulation);
    None where it is the exact gradient itself (one micro-batch, or equal denominators)."""


def references_by_micro_batch(model: nnx.Module, micro_batches: Sequence[MicroBatch],
                              loss: LossFn) -> References:
    """The same (loss, gradient) as `exact_loss_and_gradient`, with the device memory of one
    micro-batch: each micro-batch's (loss_sum, grad(loss_sum)) by one compiled program,
    summed on the host in float64, divided by the summed denominators there. The sum of
    gradients is the gradient of the sum, so it differs from the one-program reference only
    in the order float32 terms are added (~1e-7 relative). Beside it, where the
    micro-batches' denominators differ, the mean of micro-batch mean gradients from the same
    per-micro-batch gradients (`References`). Host memory: one float64 accumulator of the
    parameters (two with the mean of means), updated a leaf at a time."""
    graph, params, rest = nnx.split(model, nnx.Param, ...)

    def summed(params, micro_batch):
        out = loss(nnx.merge(graph, params, rest), micro_batch)
        return out.loss_sum, out.denominator

    step = jax.jit(jax.value_and_grad(summed, has_aux=True),
                   compiler_options=run_once_options())
    ragged = len(set(denominators(micro_batches, loss))) > 1
    total, dens, sums, means, tree = 0.0, [], None, None, None
    for micro_batch in micro_batches:
        (loss_sum, den), grad = jax.device_get(step(params, micro_batch))
        total, den = total + float(loss_sum), float(den)
        dens.append(den)
        leaves, tree = jax.tree.flatten(nnx.to_pure_dict(grad))
        if sums is None:
            sums = [np.zeros(x.shape, np.float64) for x in leaves]
            means = [np.zeros(x.shape, np.float64) for x in leaves] if ragged else None
        for k, leaf in enumerate(leaves):
            wide = leaf.astype(np.float64)
            sums[k] += wide
            if means is not None and den:
                wide /= den
                means[k] += wide
    scale = 1.0 / sum(dens) if sum(dens) else 0.0
    return References(
        loss=total * scale,
        exact=jax.tree.unflatten(tree, [(x * scale).astype(np.float32) for x in sums]),
        mean_of_means=None if means is None else jax.tree.unflatten(
            tree, [(x / len(dens)).astype(np.float32) for x in means]))


def exact_by_micro_batch(model: nnx.Module, micro_batches: Sequence[MicroBatch],
                         loss: LossFn) -> tuple[float, dict]:
    """(loss, exact gradient) of `references_by_micro_batch`."""
    found = references_by_micro_batch(model, micro_batches, loss)
    return found.loss, found.exact


def exact_gradient(model: nnx.Module, micro_batches: Sequence[MicroBatch],
                   loss: LossFn) -> nnx.State:
    """sum_i grad(loss_sum_i) / sum_i denominator_i w.r.t. the model's Params."""
    return exact_loss_and_gradient(model, micro_batches, loss)[1]


def _leaves(tree) -> list[np.ndarray]:
    """Leaves in a canonical order, on the host in their own dtype: nnx States are compared
    as their pure nested dicts."""
    if isinstance(tree, nnx.State):
        tree = nnx.to_pure_dict(tree)
    return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(tree)]


CHUNK = 1 << 22
"""Elements a thread copies at a time (16 MiB in float32), however large the model."""


THREADS = 8
"""Most threads a norm's chunks are summed in."""


def _chunk(leaf: np.ndarray, start: int) -> np.ndarray:
    """CHUNK elements of `leaf` flattened, from `start`, as a copy in float32 (float64 for
    a float64 leaf): bfloat16 and float16 widen exactly."""
    part = leaf.reshape(-1)[start:start + CHUNK]
    return part.astype(np.float64 if part.dtype == np.float64 else np.float32)


def _squares(x: np.ndarray) -> float:
    """The sum of the squares of `x`, each square and the sum in float64."""
    return float(np.einsum("i,i->", x, x, dtype=np.float64))


def distances(a, refs: Sequence) -> tuple[float, list[tuple[float, float]]]:
    """(||a||, [(||r||, ||a - r||) for each r of `refs`]) over all leaves of pytrees of
    equal structure, in one pass over `a`: each chunk of `a` read once however many
    references it is measured against. Squares are summed in float64 (`_squares`); a
    difference is taken in the wider of the two leaves' types, float32 for any narrower
    (exact where the two elements are within a factor 2 of each other, else rounded by at
    most 2^-24 of itself, so ||a - r|| is within 6e-8 of its value in exact arithmetic).
    Chunks are summed in up to `THREADS` threads and their sums added in chunk order, so
    every figure is the same whatever the threads (a parity check on the TPU v5e host
    measures a 0.6 B-parameter gradient against three references)."""
    la, lrs = _leaves(a), [_leaves(r) for r in refs]
    for lr in lrs:
        if len(la) != len(lr):
            raise ValueError(f"rel_l2 needs trees with the same leaves ({len(la)} vs "
                             f"{len(lr)})")
        for x, y in zip(la, lr, strict=True):
            if x.shape != y.shape:
                raise ValueError(f"rel_l2 leaf shapes differ: {x.shape} vs {y.shape}")

    def sums(unit: tuple[int, int]) -> tuple[float, list[tuple[float, float]]]:
        leaf, start = unit
        ca = _chunk(la[leaf], start)
        found = []
        for lr in lrs:
            cr = _chunk(lr[leaf], start)
            rr = _squares(cr)
            found.append((rr, _squares(np.subtract(cr, ca, dtype=np.result_type(cr, ca)))))
        return _squares(ca), found

    units = [(i, start) for i, x in enumerate(la) for start in range(0, x.size, CHUNK)]
    with concurrent.futures.ThreadPoolExecutor(min(THREADS, os.cpu_count() or 1)) as pool:
        parts = list(pool.map(sums, units))
    aa, totals = 0.0, [[0.0, 0.0] for _ in lrs]
    for part_aa, found in parts:
        aa += part_aa
        for total, (rr, dd) in zip(totals, found, strict=True):
            total[0] += rr
            total[1] += dd
    return float(np.sqrt(aa)), [(float(np.sqrt(rr)), float(np.sqrt(dd))) for rr, dd in totals]


def norms(a, b) -> tuple[float, float, float]:
    """(||a||, ||b||, ||a - b||) over all leaves of two pytrees of equal structure, each sum
    of squares accumulated in float64 a chunk at a time (`distances`)."""
    norm_a, ((norm_b, diff),) = distances(a, [b])
    return norm_a, norm_b, diff


def relative(diff: float, ref: float) -> float:
    """diff / ref, or diff where ref is 0: how rel_l2 reads two norms."""
    return diff / ref if ref else diff


def global_norm(tree) -> float:
    """L2 norm over all leaves of a pytree, accumulated in float64 on the host."""
    return float(np.sqrt(sum(_squares(_chunk(leaf, start)) for leaf in _leaves(tree)
                             for start in range(0, leaf.size, CHUNK))))


def rel_l2(a, b) -> float:
    """||a - b|| / ||b|| over all leaves of two pytrees of equal structure (float64, host)."""
    _, ref, diff = norms(a, b)
    return relative(diff, ref)


def max_rel_error(a: jax.Array, b: jax.Array) -> float:
    """max |a - b| / max |b|: the elementwise error relative to the reference's scale."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a64 - b64)) / max(np.max(np.abs(b64)), np.finfo(float).tiny))


__all__ = ["References", "distances", "exact_by_micro_batch", "exact_gradient",
           "exact_loss_and_gradient", "global_norm", "max_rel_error", "norms",
           "references_by_micro_batch", "rel_l2", "relative"]
