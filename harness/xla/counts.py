"""What one call of a compiled program moves and computes, read from its optimized HLO text.

XLA:TPU's `cost_analysis()` counts a while-loop body once and its `bytes accessed` counts
every operand of every instruction, on-chip memory included; its HLO text cannot be re-costed
per loop body here (the compile-only client has no cost model to call). So a plan's per-step
figures are counted from the text itself (`Compiled.as_text()`), each computation as often as
it runs:

- **HBM bytes**: every top-level instruction (not inside a fusion: a fusion is one kernel)
  reads its operands and writes its result where they live in memory space 0 (HBM; arrays
  staged in on-chip VMEM carry `S(1)` in their layout and are not counted), at their logical
  (untiled) sizes. A fusion operand that the fusion only slices (`dynamic-slice`, `slice`:
  one layer of stacked weights in a scanned loop) is counted at the slices' size; a result
  written in place by a `dynamic-update-slice` is counted at the update's size, and the
  buffer it updates is not read. A copy-start counts its read, a copy-done its write.
  Elementwise programs (optimizer updates) are counted exactly; this is the figure to compare
  arms and commits with, not a simulation of the hardware's caches.
- **FLOPs**: matrix products (`dot`, `convolution`), wherever they are (fusions included):
  2 x output elements x contracted size. Elementwise FLOPs are left out (a vanishing share).
- **Collective bytes**, by kind (all-gather, reduce-scatter, all-reduce, all-to-all,
  collective-permute): what each device sends over the interconnect, as ring algorithms
  move it over a group of n devices: an all-gather (n-1)/n of its gathered result, a
  reduce-scatter (n-1)/n of its operand, an all-reduce 2(n-1)/n of its operand (a
  reduce-scatter, then an all-gather), an all-to-all (n-1)/n of its operand, a
  collective-permute its operand. So a gradient all-reduced where a reduce-scatter would
  do counts twice. Asynchronous pairs are counted at their start.

Loops run `trip count` times (their condition once more; harness.xla.loops reads it from
the loop). A loop whose trip count cannot be read makes every figure unavailable (None, with
the reason), never silently low. A conditional counts its costliest branch (a skipped
optimizer step reads nothing).
"""

from __future__ import annotations

import dataclasses
import math
import re

from harness.xla.hlo import (
    Instruction,
    Module,
    Unavailable,
    array_bytes,
    dims,
    parameter_numbers,
    parse,
    tuple_elements,
)
from harness.xla.loops import trip_count

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all",
               "collective-permute")
"""The collective kinds counted, as HLO names them (a `-start` suffix is the async form)."""

_FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
         "partition-id", "replica-id", "opt-barrier", "while", "call", "conditional",
         "call-start", "call-update", "call-done", "async-start", "async-update",
         "async-done", "custom-call-start", "custom-call-update", "custom-call-done",
         "all-gather-done", "all-reduce-done", "collective-permute-done", "send-done",
         "recv-done", "iota"}
"""Instructions that move no data of their own (control flow is counted inside). The async
wrappers run a computation on another execution thread (XLA:TPU7x runs collectives on its
SparseCores as `custom-call-start/update/done` around a computation holding the
all-gather): that computation's instructions are counted; the wrappers' operands and
results are the same buffers again, plus the thread's scratch."""


@dataclasses.dataclass
class Costs:
    """What one run of a computation moves and computes (per device)."""

    hbm_bytes: float = 0.0
    flops: float = 0.0
    collective_bytes: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(COLLECTIVES, 0.0))
    trip_counts: list[int] = dataclasses.field(default_factory=list)

    def add(self, other: Costs, times: float = 1.0) -> None:
        self.hbm_bytes += times * other.hbm_bytes
        self.flops += times * other.flops
        for kind, value in other.collective_bytes.items():
            self.collective_bytes[kind] += times * value
        self.trip_counts += other.trip_counts

    def most(self, other: Costs) -> None:
        """Each figure the larger of the two (a conditional's costliest branch)."""
        self.hbm_bytes = max(self.hbm_bytes, other.hbm_bytes)
        self.flops = max(self.flops, other.flops)
        for kind, value in other.collective_bytes.items():
            self.collective_bytes[kind] = max(self.collective_bytes[kind], value)
        self.trip_counts += other.trip_counts


def _collective_kind(opcode: str) -> str | None:
    base = opcode.removesuffix("-start")
    return base if base in COLLECTIVES else None


def group_size(module: Module, inst: Instruction) -> int:
    """Devices in each group of a collective's replica_groups (all of them when none)."""
    text = inst.attributes
    if found := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", text):
        sizes = {name.strip(" '"): int(size) for name, size in
                 (axis.split("=") for axis in found.group(1).split(","))}
        group = 1
        # Each entry is an axis ('fsdp') or a sub-axis of one ('fsdp':(2)2: of size 2).
        for axis in filter(None, (a.strip() for a in found.group(2).split(","))):
            name, _, sub = axis.partition(":")
            sub_size = re.fullmatch(r"\(\d+\)(\d+)", sub.strip())
            group *= int(sub_size.group(1)) if sub_size else sizes[name.strip(" '")]
        return group if found.group(2).strip() else math.prod(sizes.values())
    if found := re.search(r"replica_groups=\[(\d+),(\d+)\]<=", text):  # [groups, size]
        return int(found.group(2))
    if found := re.search(r"replica_groups=\{\{([^}]*)\}", text):
        return len(found.group(1).split(","))
    return module.partitions


_SENT = {"all-gather": 1.0, "reduce-scatter": 1.0, "all-reduce": 2.0, "all-to-all": 1.0}
"""Of (n-1)/n of a collective's buffer, what one device sends (ring algorithms)."""


def _collective_bytes(module: Module, inst: Instruction, kind: str) -> float:
    operands = sum(array_bytes(module.by_name[o].shape) for o in inst.operands
                   if o in module.by_name)
    if kind == "collective-permute":
        return operands
    size = operands
    if kind == "all-gather":
        size = array_bytes(inst.shape)
        # all-gather-start's result tuple holds its operands beside the gathered buffers.
        size -= operands if inst.opcode.endswith("-start") else 0
    n = group_size(module, inst)
    return _SENT[kind] * size * (n - 1) / n


def _matmul_flops(module: Module, inst: Instruction) -> float:
    if inst.opcode == "convolution":
        return convolution_flops(module, inst)
    out = math.prod(dims(inst.shape))
    lhs = dims(module.by_name[inst.operands[0]].shape)
    contracting = re.search(r"lhs_contracting_dims=\{([0-9,]*)\}", inst.attributes)
    axes = [int(d) for d in contracting.group(1).split(",") if d] if contracting else []
    return 2.0 * out * math.prod(lhs[d] for d in axes)


_LABELS = re.compile(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")


def _window(attributes: str, spatial: int) -> list[dict[str, int]]:
    """Per spatial dimension of a convolution's window: size, stride, padding low and high,
    lhs (base) and rhs (window) dilation. Absent fields are 1 (0 for padding)."""
    found = [{"size": 1, "stride": 1, "low": 0, "high": 0, "lhs_dilate": 1, "rhs_dilate": 1}
             for _ in range(spatial)]
    window = _WINDOW.search(attributes)
    for field in (window.group(1).split() if window else ()):
        key, _, value = field.partition("=")
        for d, part in enumerate(value.split("x")):
            if key == "pad":
                found[d]["low"], found[d]["high"] = (int(x) for x in part.split("_"))
            elif key in ("size", "stride", "lhs_dilate", "rhs_dilate"):
                found[d][key] = int(part)
    return found


def _valid_taps(window: dict[str, int], in_size: int, out_size: int) -> int:
    """(output position, kernel tap) pairs of one spatial dimension that read an input
    element: a tap that falls in the padding, or between the elements of a dilated input,
    multiplies nothing."""
    import numpy as np

    out = np.arange(out_size)
    count = 0
    for tap in range(window["size"]):
        at = out * window["stride"] - window["low"] + tap * window["rhs_dilate"]
        index = at // window["lhs_dilate"]
        count += int(np.count_nonzero((at % window["lhs_dilate"] == 0) & (index >= 0)
                                      & (index < in_size)))
    return count


def convolution_flops(module: Module, inst: Instruction) -> float:
    """FLOPs of a convolution, as XLA's cost model counts them: 2 x (input features per
    group) x output features x (batch per group) x the (output position, kernel tap) pairs
    of every spatial dimension that read an input element. XLA:TPU writes batched matmuls
    (attention's per-head einsums) as convolutions whose window stands for a batch or head
    dimension, padded so that only one tap of each window reads data: counting every tap
    of the window would count the padding's zeros."""
    labels = _LABELS.search(inst.attributes)
    if labels is None:
        raise Unavailable(f"convolution %{inst.name} has no readable dim_labels")
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs = dims(module.by_name[inst.operands[0]].shape)
    rhs = dims(module.by_name[inst.operands[1]].shape)
    out = dims(inst.shape)
    if (len(lhs), len(rhs), len(out)) != (len(lhs_labels), len(rhs_labels), len(out_labels)):
        raise Unavailable(f"convolution %{inst.name}: dim_labels do not match its shapes")
    groups = {key: int(inst.attribute(key) or 1)
              for key in ("feature_group_count", "batch_group_count")}
    spatial = len(lhs_labels) - 2
    taps = math.prod(
        _valid_taps(w, lhs[lhs_labels.index(str(d))], out[out_labels.index(str(d))])
        for d, w in enumerate(_window(inst.attributes, spatial)))
    return (2.0 * (lhs[lhs_labels.index("f")] // groups["feature_group_count"])
            * rhs[rhs_labels.index("o")]
            * (lhs[lhs_labels.index("b")] // groups["batch_group_count"]) * taps)


def _users(module: Module, computation: str) -> dict[str, list[Instruction]]:
    users: dict[str, list[Instruction]] = {}
    for inst in module.computations[computation]:
        for operand in inst.operands:
            users.setdefault(operand, []).append(inst)
    return users


def _readers(users: dict[str, list[Instruction]], name: str) -> list[tuple[Instruction, str]]:
    """(instruction, the name it reads) of every reader of `name` in one computation, seen
    through the bitcasts and reshapes between (which move nothing)."""
    found = []
    for user in users.get(name, []):
        if user.opcode in ("bitcast", "reshape"):
            found += _readers(users, user.name)
        else:
            found.append((user, name))
    return found


def _sliced_bytes(module: Module, readers: list[tuple[Instruction, str]]) -> float | None:
    """The bytes `readers` (a value's, `_readers`) read where each reads a slice of it,
    directly or as the parameter of a fusion nested in this one (XLA fuses a scanned
    layer's dynamic slice of a stacked weight into the matmul that reads it, as a fusion
    of its own); None where any reads it whole."""
    if not readers:
        return None
    total = 0.0
    for reader, read in readers:
        if reader.opcode in ("dynamic-slice", "slice") and reader.operands[0] == read:
            total += array_bytes(reader.shape)
            continue
        if reader.opcode != "fusion":
            return None
        nested = reader.callees()["calls"]
        by_number = {number: param for param, number in
                     parameter_numbers(module, nested).items()}
        for number, operand in enumerate(reader.operands):
            if operand != read:
                continue
            inner = _sliced_bytes(module, _readers(_users(module, nested), by_number[number]))
            if inner is None:
                return None
            total += inner
    return total


def _fusion_io(module: Module, fusion: Instruction) -> float:
    """HBM bytes of one fusion: its operands and result in memory space 0, slices read
    (inside nested fusions too) and in-place updates counted at their size."""
    fused = fusion.callees()["calls"]
    users = _users(module, fused)
    params = {number: module.by_name[name]
              for name, number in parameter_numbers(module, fused).items()}

    in_place: set[int] = set()
    total = 0.0
    for number, operand in enumerate(fusion.operands):
        shape = module.by_name[operand].shape if operand in module.by_name else ""
        if not array_bytes(shape, hbm_only=True):
            continue
        param = params.get(number)
        readers = _readers(users, param.name) if param is not None else []
        sliced = _sliced_bytes(module, readers)
        if sliced is not None:
            total += sliced
        elif readers and all(u.opcode == "dynamic-update-slice" and u.operands[0] == param.name
                             for u, _ in readers):
            in_place.add(number)  # updated in place: only the update is written below
        else:
            total += array_bytes(shape, hbm_only=True)
    root = module.root(fused)
    outputs = ([module.by_name[o] for o in root.operands] if root.opcode == "tuple"
               else [root])
    shapes = tuple_elements(fusion.shape) if root.opcode == "tuple" else [fusion.shape]
    for output, shape in zip(outputs, shapes, strict=False):
        if output.opcode == "dynamic-update-slice":
            written = array_bytes(module.by_name[output.operands[1]].shape)
            total += written if array_bytes(shape, hbm_only=True) else 0
        else:
            total += array_bytes(shape, hbm_only=True)
    return total



def _io(module: Module, inst: Instruction) -> float:
    """HBM bytes one top-level instruction reads and writes."""
    if inst.opcode in _FREE or (inst.opcode == "custom-call"
                                and "AllocateBuffer" in inst.attributes):
        return 0.0
    if inst.opcode == "fusion":
        return _fusion_io(module, inst)
    if inst.opcode in ("dynamic-slice", "slice"):
        return 2.0 * array_bytes(inst.shape, hbm_only=True)
    if inst.opcode == "dynamic-update-slice":
        update = array_bytes(module.by_name[inst.operands[1]].shape)
        return 2.0 * update if array_bytes(inst.shape, hbm_only=True) else 0.0
    total = 0.0
    if inst.opcode != "copy-done":
        total += sum(array_bytes(module.by_name[o].shape, hbm_only=True)
                     for o in inst.operands if o in module.by_name)
    if inst.opcode != "copy-start":
        total += array_bytes(inst.shape, hbm_only=True)
    return total


@dataclasses.dataclass(frozen=True)
class Entry:
    """One top-level instruction (not inside a fusion) over one call of its module: what all
    its runs move and compute (a fusion's FLOPs are its fused matmuls')."""

    computation: str
    instruction: Instruction
    runs: float
    """How often it runs per call (the product of its enclosing loops' trip counts)."""
    costs: Costs


def _own(module: Module, inst: Instruction, fused: bool, memo: dict) -> Costs:
    """What one run of `inst` itself moves and computes (a fusion with its body)."""
    own = Costs()
    kind = _collective_kind(inst.opcode)
    if kind is not None:
        own.collective_bytes[kind] += _collective_bytes(module, inst, kind)
    if inst.opcode in ("dot", "convolution"):
        own.flops += _matmul_flops(module, inst)
    if not fused:
        own.hbm_bytes += _io(module, inst)
    if inst.opcode == "fusion":
        own.add(_cost(module, inst.callees()["calls"], True, memo))
    return own


def _cost(module: Module, computation: str, fused: bool, memo: dict,
          runs: float = 1.0, ledger: list[Entry] | None = None) -> Costs:
    """One run of `computation`; with `ledger`, an `Entry` per top-level instruction over
    all `runs` of it is appended (of a conditional, the costliest branch's)."""
    key = (computation, fused)
    if key in memo and ledger is None:
        return memo[key]
    memo[key] = Costs()  # guards against cycles
    costs = Costs()
    for inst in module.computations[computation]:
        callees = inst.callees()
        own = _own(module, inst, fused, memo)
        costs.add(own)
        if ledger is not None and not fused:
            scaled = Costs()
            scaled.add(own, runs)
            ledger.append(Entry(computation, inst, runs, scaled))
        if inst.opcode == "while":
            trips = trip_count(module, inst)
            costs.add(_cost(module, callees["body"], fused, memo, runs * trips, ledger), trips)
            costs.add(_cost(module, callees["condition"], fused, memo, runs * (trips + 1),
                            ledger), trips + 1)
            costs.trip_counts.append(trips)
        elif inst.opcode == "conditional":
            branches, taken = Costs(), None
            for name in callees.values():
                entries = None if ledger is None else []
                branch = _cost(module, name, fused, memo, runs, entries)
                branches.most(branch)
                if taken is None or (branch.hbm_bytes, branch.flops) > taken[0]:
                    taken = ((branch.hbm_bytes, branch.flops), entries)
            costs.add(branches)
            if ledger is not None and taken is not None:
                ledger += taken[1]
        elif inst.opcode != "fusion":
            for name in callees.values():
                if name in module.computations:
                    costs.add(_cost(module, name, fused, memo, runs, ledger))
    memo[key] = costs
    return costs


def costs(hlo_text: str) -> Costs:
    """HBM bytes, matmul FLOPs and collective bytes by kind of one call of a compiled module
    (per device: an SPMD module is one device's program), loops counted as they run."""
    module = parse(hlo_text)
    return _cost(module, module.entry, False, {})


def entries(source: str | Module) -> list[Entry]:
    """Every top-level instruction of one call of a compiled module (its HLO text, or the
    text parsed) with what all its runs move and compute, in program order (loop bodies
    after their loop; of a conditional, the costliest branch): the figures of `costs`,
    instruction by instruction."""
    module = parse(source) if isinstance(source, str) else source
    ledger: list[Entry] = []
    _cost(module, module.entry, False, {}, 1.0, ledger)
    return ledger


def heaviest(hlo_text: str, count: int = 20) -> list[Entry]:
    """The `count` top-level instructions that move the most HBM bytes over one call (all
    their runs), heaviest first: where a program's traffic goes."""
    return sorted(entries(hlo_text), key=lambda e: -e.costs.hbm_bytes)[:count]


def hbm_bytes(hlo_text: str) -> int:
    """Bytes one call of a compiled module reads from and writes to HBM (see the module
    docstring). On a backend without memory spaces (CPU) it is XLA's `bytes accessed` for
    straight-line elementwise programs, to within the scalars (XLA counts a scalar operand
    once per use in a fusion), which the tests check."""
    return int(costs(hlo_text).hbm_bytes)
