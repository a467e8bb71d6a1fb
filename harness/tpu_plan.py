"""XLA's plan for a TPU, compiled on a machine without one.

libtpu compiles for a named TPU topology ("tpu7x:2x2x1") through compile-only devices: no
chip is needed, so the optimized HLO, cost analysis and memory plan of a program on a TPU7x
can be read on a laptop or in CI. `make` installs libtpu outside the import path
(`.venv/libtpu`): importable, it makes JAX look for TPU chips, and print that it found none,
in every process. This module loads it when asked, after JAX's own backends are up.
Loaded, it also changes the process's profiler: trace captures taken afterwards carry
the HLO of every program. Plan in a process that does not also trace.

HBM traffic: XLA:TPU's `bytes accessed` counts every operand and result of every instruction,
so an operand staged into on-chip VMEM (memory space S(1)) by a copy is counted three times:
the copy's HBM read, its VMEM write, and the fusion's VMEM read. Only the first is HBM
traffic. `hbm_bytes` counts the bytes an instruction reads from or writes to memory space 0
(HBM) and nothing else; on a backend without memory spaces (CPU) it is XLA's `bytes
accessed` to within the scalars (XLA counts a scalar operand once per use in a fusion), which
the tests check.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import warnings
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

LIBTPU_ENV = "PARITY_LIBTPU"
"""Environment variable naming libtpu.so; default: where `make` installs it."""

DEFAULT_LIBTPU = Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"
"""`.venv/libtpu/libtpu/libtpu.so`: `pip install --target .venv/libtpu` of the pinned wheel."""

TPU7X = "tpu7x:2x2x1"
"""The nightly target: one TPU7x host (4 chips)."""


def libtpu_path() -> Path:
    path = Path(os.environ.get(LIBTPU_ENV) or DEFAULT_LIBTPU)
    if not path.is_file():
        raise FileNotFoundError(
            f"libtpu not found at {path}: run `make test` (it installs the pinned libtpu into "
            f".venv/libtpu), or set {LIBTPU_ENV} to a libtpu.so")
    return path


@functools.cache
def topology_devices(name: str = TPU7X) -> tuple[jax.Device, ...]:
    """The compile-only devices of TPU topology `name` (e.g. "tpu7x:2x2x1", "v5e:2x2")."""
    jax.devices()  # this process's own backends first: the TPU plugin must not become one
    os.environ.setdefault("TPU_LIBRARY_PATH", str(libtpu_path()))
    from jax.experimental import topologies

    return tuple(topologies.get_topology_desc(topology_name=name, platform="tpu").devices)


def mesh_like(mesh: Mesh, devices) -> Mesh:
    """A mesh of `mesh`'s shape and axis names over the first `mesh.size` of `devices`."""
    if len(devices) < mesh.size:
        raise ValueError(f"the mesh {dict(mesh.shape)} needs {mesh.size} devices; the target "
                         f"has {len(devices)}")
    return Mesh(np.array(devices[:mesh.size]).reshape(mesh.devices.shape), mesh.axis_names)


def compile_plan(lowered: jax.stages.Lowered) -> jax.stages.Compiled:
    """Compiles `lowered` (lowered for compile-only devices). JAX's persistent compilation
    cache stores the plan but cannot load a compile-only executable back: on a hit it warns
    and compiles again, which is the plan wanted, so that warning is dropped here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Error reading persistent compilation cache entry")
        return lowered.compile()


# ------------------------------------------------------------------------------ HBM bytes
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
             "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"\b(" + "|".join(_ITEMSIZE) + r")\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(?:ENTRY )?%([\w.-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.-]+) = (.+?) ([a-z][a-z0-9-]*)\((.*)$")
_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
         "partition-id", "replica-id", "opt-barrier"}
_NESTED = {"while", "call", "async-start", "async-done", "custom-call"}


def _hbm_array_bytes(shape: str) -> int:
    """Logical (untiled) bytes of the arrays in `shape` that live in memory space 0."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(shape):
        if re.search(r"S\((\d+)\)", layout or "") is None:
            total += _ITEMSIZE[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


def _operands(rest: str) -> list[str]:
    depth = 0
    for i, ch in enumerate(rest):
        depth += ch == "("
        if ch == ")":
            if depth == 0:
                return re.findall(r"%([\w.-]+)", rest[:i])
            depth -= 1
    raise ValueError(f"unbalanced operand list: {rest[:80]}")


def _computations(hlo_text: str) -> tuple[dict[str, list[tuple]], str]:
    computations: dict[str, list[tuple]] = {}
    entry, current = None, None
    for line in hlo_text.splitlines():
        if header := _HEADER.match(line):
            current = computations.setdefault(header.group(1), [])
            entry = header.group(1) if line.startswith("ENTRY") else entry
        elif (inst := _INSTRUCTION.match(line)) and current is not None:
            current.append(inst.groups())
    if entry is None:
        raise ValueError("no ENTRY computation: give the text of a compiled (optimized) module")
    return computations, entry


def hbm_bytes(hlo_text: str) -> int:
    """Bytes one call of a compiled module reads from and writes to HBM (memory space 0).

    `hlo_text` is `Compiled.as_text()`. Each top-level instruction counts its operands and
    results in memory space 0 at their logical sizes, each operand read whole (exact for
    elementwise programs such as optimizer updates; XLA counts less for a fusion that reads
    only a slice of an operand); a copy-start counts only its read (its
    result is the on-chip destination), a copy-done only its write. A conditional counts its
    costliest branch (a skipped optimizer step reads nothing). Programs with loops, calls or
    custom calls are refused: their cost is not the sum of their instructions.
    """
    computations, entry = _computations(hlo_text)
    shapes = {name: shape for body in computations.values() for name, shape, _, _ in body}

    def cost(computation: str) -> int:
        total = 0
        for name, shape, opcode, rest in computations[computation]:
            if opcode in _FREE:
                continue
            if opcode in _NESTED:
                raise ValueError(f"{name} is a {opcode}: hbm_bytes counts straight-line "
                                 "programs (and conditionals) only")
            if opcode == "conditional":
                branches = re.search(r"(?:branch_computations=\{([^}]*)\}|"
                                     r"true_computation=(%[\w.-]+), false_computation=(%[\w.-]+))",
                                     rest)
                names = re.findall(r"%([\w.-]+)", " ".join(g for g in branches.groups() if g))
                total += max(cost(b) for b in names)
                continue
            if opcode != "copy-done":
                total += sum(_hbm_array_bytes(shapes[o]) for o in _operands(rest) if o in shapes)
            if opcode != "copy-start":
                total += _hbm_array_bytes(shape)
        return total

    return cost(entry)
