"""Orbax checkpoints of the engine's device state, between steps or mid-accumulation.

The state is flattened to its leaves and saved as a flat dict `leaf_00000 ...` plus a JSON
sidecar with the leaf paths and the step position; restoring needs an engine compiled for
the same model and optimizer, whose tree structure and shardings are the restore target.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

SIDECAR = "parity_engine.json"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Snapshot:
    """Everything a step needs to resume exactly."""

    state: Any
    """(params, opt_state, rest, step) device arrays."""
    accumulator: Any | None
    """The partial accumulator mid-step, or None between steps."""
    micro_batches_done: int
    """Micro-batches already accumulated into `accumulator` (0 between steps)."""
    steps_dispatched: int
    """Optimizer steps the engine has dispatched (its host-side step count)."""


def _flat(tree) -> tuple[dict[str, jax.Array], list[str]]:
    with_paths, _ = jax.tree_util.tree_flatten_with_path(tree)
    leaves = {f"leaf_{i:05d}": leaf for i, (_, leaf) in enumerate(with_paths)}
    return leaves, [jax.tree_util.keystr(path) for path, _ in with_paths]


def save(path: str | Path, snapshot: Snapshot) -> None:
    path = Path(path).absolute()
    tree = (snapshot.state, snapshot.accumulator)
    leaves, paths = _flat(tree)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(path / "state", leaves, force=True)
    checkpointer.wait_until_finished()
    meta = {"micro_batches_done": snapshot.micro_batches_done,
            "steps_dispatched": snapshot.steps_dispatched,
            "has_accumulator": snapshot.accumulator is not None,
            "leaf_paths": paths}
    if jax.process_index() == 0:
        (path / SIDECAR).write_text(json.dumps(meta, indent=1))


def restore(path: str | Path, target_state, target_accumulator) -> Snapshot:
    """Restores into the structure and shardings of the given targets (arrays or abstract)."""
    path = Path(path).absolute()
    sidecar = path / SIDECAR
    if not sidecar.exists():
        raise FileNotFoundError(f"{path} is not an engine checkpoint (no {SIDECAR}); pass the "
                                "directory save_checkpoint() wrote")
    meta = json.loads(sidecar.read_text())
    accumulator = target_accumulator if meta["has_accumulator"] else None
    if meta["has_accumulator"] and target_accumulator is None:
        raise ValueError("checkpoint holds a partial accumulator but no accumulator target "
                         "was given")
    tree = (target_state, accumulator)
    leaves, paths = _flat(tree)
    if paths != meta["leaf_paths"]:
        raise ValueError(f"checkpoint at {path} was saved from a different model or optimizer "
                         f"({len(meta['leaf_paths'])} leaves vs {len(paths)} here)")
    abstract = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.sharding)
                for k, v in leaves.items()}
    restored = ocp.StandardCheckpointer().restore(path / "state", abstract)
    treedef = jax.tree.structure(tree)
    state, acc = jax.tree.unflatten(treedef, [restored[k] for k in sorted(restored)])
    return Snapshot(state=state, accumulator=acc, micro_batches_done=meta["micro_batches_done"],
                    steps_dispatched=meta["steps_dispatched"])
