"""Where exact reference gradients are kept between cells and between runs: one entry per
(model and weights, data, dtype, matmul precision, the code that computes it, the stack and
device it ran on), size-bounded, least recently used first out.

A reference depends on none of the arm, the mesh, the optimizer or the timing options: every
arm of a shape, and every later run of it, reads the one entry the first computed. Its key
also holds a digest of the source that computes it (our decoder and the workload: any edit
there is a new entry, never a stale one) and the JAX/jaxlib/libtpu versions, backend and
device kind (a reference in a rounding dtype is the device's own arithmetic).

An entry is a directory `<key>/` holding `gradient.npz` (the gradient, one float32 array a
leaf, named by its path), where the work is ragged `mean_of_means.npz` (the same for the
mean of micro-batch means), where the arithmetic rounds `exact32.npz` (the gradient in exact
float32: an entry of bfloat16 work is then twice its gradient's size) and `meta.json` (the
loss, the floor, the seconds computing it took), written whole: into a temporary directory
renamed into place, so a reader sees an entry complete or not at all. A read touches
`meta.json`; after a write, the oldest entries go until the store is under its bound
(`REFERENCE_BOUND`, default `DEFAULT_BOUND_GB`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from harness.contract import REFERENCE_BOUND, cell_hash

DEFAULT_BOUND_GB = 16.0
"""The store's default size bound: a qwen3-0.6b reference is 2.4 GB (its float32
gradient), 4.8 GB with its exact float32 twin (bfloat16 work), so three shapes of it stay."""
NOT_IN_KEY = ("mesh", "optimizer", "learning_rate", "clip", "attention", "attention_block_q",
              "attention_block_kv", "logits_chunk", "scan_backward")
"""Spec fields a reference does not depend on: it runs on one device, before any update,
through our decoder's plain computation (XLA attention, whole logits) whatever the arm's."""
SOURCES = ("engine/model", "arms/workload", "arms/spec.py")
"""The code a reference is computed by, relative to the repository: its digest is in the key."""
SEPARATOR = "/"
OPTIONAL = ("mean_of_means", "exact32")
"""The Entry fields an entry may hold or not, each kept as `<field>.npz` where it does, and
`meta.json` saying which it holds."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Entry:
    """One stored reference."""

    loss: float
    """The exact loss, sum/sum."""
    gradient: dict
    """The exact gradient, a pure dict of float32 numpy arrays in our decoder's layout."""
    floor_rel_l2: float | None
    """Its distance from the same reference in exact float32 (None where it is exact)."""
    computed_s: float
    """Wall seconds computing it took (its references, and the floor's)."""
    mean_of_means: dict | None = None
    """The mean of micro-batch mean gradients of the same work (what a trainer averaging
    micro-batch means computes), where the micro-batches' denominators differ; else None."""
    exact32: dict | None = None
    """Where the arithmetic rounds, the exact gradient in exact float32 (the floor's other
    end), so each arm's own distance from it can be said; None where `gradient` is that."""


def source_digest(root: Path | None = None) -> str:
    """sha256 (16 hex digits) of the source files that compute a reference."""
    root = root or Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for name in SOURCES:
        path = root / name
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(str(file.relative_to(root)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def reference_key(spec: dict, precision: str, stack: dict) -> str:
    """The entry name of `spec`'s reference at matmul `precision`, computed on `stack`
    ({backend, device_kind, versions...}: what the arithmetic depends on)."""
    work = {k: v for k, v in spec.items() if k not in NOT_IN_KEY}
    return cell_hash({"spec": work, "precision": precision, "stack": stack,
                      "source": source_digest()})


def _flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, path + SEPARATOR))
        else:
            flat[path] = np.asarray(value, np.float32)
    return flat


def _unflatten(flat) -> dict:
    tree: dict = {}
    for path in flat.files:
        keys = path.split(SEPARATOR)
        node = tree
        for key in keys[:-1]:
            node = node.setdefault(int(key) if key.isdigit() else key, {})
        node[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = flat[path]
    return tree


def _flush(directory: Path) -> None:
    """Writes `directory`'s files through to the disk now: a 2.4 GB entry left to the
    kernel's writeback would be flushed while the next cell is timed, on its host."""
    for path in directory.iterdir():
        with open(path, "rb") as written:
            os.fsync(written.fileno())


def bound_bytes() -> int:
    """The store's size bound: $PARITY_REFERENCE_BOUND_GB, else DEFAULT_BOUND_GB."""
    raw = os.environ.get(REFERENCE_BOUND)
    try:
        gb = float(raw) if raw else DEFAULT_BOUND_GB
    except ValueError:
        raise ValueError(f"${REFERENCE_BOUND}={raw!r}: give the bound in GB, e.g. 16") from None
    return int(gb * 1e9)


class ReferenceStore:
    """The references kept under one directory (see the module docstring)."""

    def __init__(self, root: str | Path, bound: int | None = None):
        self.root = Path(root)
        self.bound = bound_bytes() if bound is None else bound

    def read(self, key: str) -> Entry | None:
        """The entry `key`, or None where it is not (or no longer) stored."""
        path = self.root / key
        try:
            meta = json.loads((path / "meta.json").read_text())
            with np.load(path / "gradient.npz") as flat:
                gradient = _unflatten(flat)
            optional = {}
            for name in OPTIONAL:
                if meta.get(name):
                    with np.load(path / f"{name}.npz") as flat:
                        optional[name] = _unflatten(flat)
        except (FileNotFoundError, NotADirectoryError):
            return None
        os.utime(path / "meta.json")  # most recently used
        return Entry(loss=meta["loss"], gradient=gradient, floor_rel_l2=meta["floor_rel_l2"],
                     computed_s=meta["computed_s"], **optional)

    def write(self, key: str, entry: Entry) -> None:
        """Stores `entry` under `key` whole, then evicts the least recently used entries
        until the store is within its bound (never the one just written)."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".writing-", dir=self.root))
        try:
            np.savez(tmp / "gradient.npz", **_flatten(entry.gradient))
            for name in OPTIONAL:
                if getattr(entry, name) is not None:
                    np.savez(tmp / f"{name}.npz", **_flatten(getattr(entry, name)))
            (tmp / "meta.json").write_text(json.dumps({
                "loss": entry.loss, "floor_rel_l2": entry.floor_rel_l2,
                "computed_s": entry.computed_s, "written": time.time(),
                **{name: getattr(entry, name) is not None for name in OPTIONAL}}))
            _flush(tmp)
            with contextlib.suppress(OSError):  # another cell wrote it first: theirs stands
                tmp.rename(self.root / key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.evict(keep=key)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, path) of every complete entry, least recently used first."""
        found = []
        for path in self.root.iterdir() if self.root.is_dir() else ():
            meta = path / "meta.json"
            if path.name.startswith(".") or not meta.exists():
                continue
            size = sum(f.stat().st_size for f in path.iterdir())
            found.append((meta.stat().st_mtime, size, path))
        return sorted(found)

    def evict(self, keep: str | None = None) -> list[str]:
        """Removes the least recently used entries (but `keep`) until the store's bytes are
        within its bound; returns their keys."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, path in entries:
            if total <= self.bound:
                break
            if path.name == keep:
                continue
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            removed.append(path.name)
        return removed
