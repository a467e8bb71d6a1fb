"""The exact reference gradient and the pytree distance every parity number is quoted in."""

from __future__ import annotations

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
"""Elements per float64 pass: a few MiB of host memory at a time, however large the model."""


def _chunks(leaf: np.ndarray):
    """`leaf` flattened, CHUNK elements at a time, each as a float64 copy."""
    flat = leaf.reshape(-1)
    for i in range(0, flat.size, CHUNK):
        yield flat[i:i + CHUNK].astype(np.float64)


def norms(a, b) -> tuple[float, float, float]:
    """(||a||, ||b||, ||a - b||) over all leaves of two pytrees of equal structure, in one
    pass, each sum of squares accumulated in float64 a chunk at a time (a 0.6 B-parameter
    gradient pair takes seconds, not the minutes whole-tree float64 copies took)."""
    la, lb = _leaves(a), _leaves(b)
    if len(la) != len(lb):
        raise ValueError(f"rel_l2 needs trees with the same leaves ({len(la)} vs {len(lb)})")
    aa = bb = dd = 0.0
    for x, y in zip(la, lb, strict=True):
        if x.shape != y.shape:
            raise ValueError(f"rel_l2 leaf shapes differ: {x.shape} vs {y.shape}")
        for cx, cy in zip(_chunks(x), _chunks(y), strict=True):
            aa, bb = aa + float(cx @ cx), bb + float(cy @ cy)
            cx -= cy
            dd += float(cx @ cx)
    return float(np.sqrt(aa)), float(np.sqrt(bb)), float(np.sqrt(dd))


def relative(diff: float, ref: float) -> float:
    """diff / ref, or diff where ref is 0: how rel_l2 reads two norms."""
    return diff / ref if ref else diff


def global_norm(tree) -> float:
    """L2 norm over all leaves of a pytree, accumulated in float64 on the host."""
    return float(np.sqrt(sum(float(c @ c) for leaf in _leaves(tree) for c in _chunks(leaf))))


def rel_l2(a, b) -> float:
    """||a - b|| / ||b|| over all leaves of two pytrees of equal structure (float64, host)."""
    _, ref, diff = norms(a, b)
    return relative(diff, ref)


def max_rel_error(a: jax.Array, b: jax.Array) -> float:
    """max |a - b| / max |b|: the elementwise error relative to the reference's scale."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a64 - b64)) / max(np.max(np.abs(b64)), np.finfo(float).tiny))


__all__ = ["References", "exact_by_micro_batch", "exact_gradient", "exact_loss_and_gradient",
           "global_norm", "max_rel_error", "norms", "references_by_micro_batch", "rel_l2",
           "relative"]
