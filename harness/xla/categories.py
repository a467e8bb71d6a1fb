"""One name for what an HLO instruction does, wherever operations are grouped: a plan's
executables, a compiled cost, a trace's ops.

A top-level instruction (one kernel, or a step of control flow) gets exactly one category:

- `matmul`: a `dot` or `convolution`, or a fusion whose body holds one (XLA fuses the
  producers and consumers of a matmul into it);
- `fusion: <kind>`: any other fusion, by XLA's fusion kind (`loop`: elementwise, `input`:
  a reduction, `output`, `custom`);
- `copy/relayout`: `copy`, `copy-start`/`copy-done` (a change of layout or memory space)
  and an unfused `transpose`;
- `dynamic-update-slice`: an in-place update, alone or as the root of a fusion (a scanned
  layer writing its slice of a stacked buffer);
- `collective: <kind>`: all-gather, reduce-scatter, all-reduce, all-to-all,
  collective-permute, their `-start`/`-done` halves included;
- `custom-call: <target>`: by its `custom_call_target`;
- `host transfer`: send, recv, infeed, outfeed and their `-done` halves;
- `control flow`: while, conditional, call and the async wrappers that run a computation
  on another thread (`async-*`, `custom-call-start/update/done`: XLA:TPU7x runs collectives
  on its SparseCores so); what they run is categorized inside;
- `no data`: parameters, constants, tuples, bitcasts and the like, which move nothing;
- `other: <opcode>`: anything else, named by its opcode, never dropped.

A trace names its ops by HLO instruction name ("fusion.12", "all-gather-start.3"): with the
program's HLO the instruction itself is categorized, without it the opcode the name begins
with (XLA names an instruction after its opcode, then a number).
"""

from __future__ import annotations

import dataclasses
import re

from harness.xla import counts
from harness.xla.hlo import Instruction, Module, parse
from reports.movers import Totals

MATMUL = "matmul"
COPY = "copy/relayout"
UPDATE = "dynamic-update-slice"
HOST = "host transfer"
CONTROL = "control flow"
NO_DATA = "no data"

_COPIES = {"copy", "copy-start", "copy-done", "transpose"}
_HOST = {"send", "recv", "send-done", "recv-done", "infeed", "outfeed"}
ASYNC = {"call-start", "call-update", "call-done", "async-start", "async-update",
         "async-done", "custom-call-start", "custom-call-update", "custom-call-done"}
"""The wrappers that run a computation on another thread (XLA:TPU7x runs collectives so,
on its SparseCores)."""
_CONTROL = {"while", "conditional", "call"} | ASYNC
_NO_DATA = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all",
            "partition-id", "replica-id", "opt-barrier", "iota"}
_FUSION_KIND = re.compile(r"\bkind=k(\w+)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
_OPCODE_OF_NAME = re.compile(r"^%?([a-z][a-z-]*?)(?:[.-]\d+)*$")
_NUMBER = re.compile(r"(?:[.-]\d+)+$")
_NAMED_FUSION = re.compile(r"^([a-z0-9_]+)_fusion$")
_WRAPPED = "wrapped_"
_TRACED_AS = {"cond": "conditional"}
"""Names JAX gives the instructions of its control flow (lax.cond's `cond.3`), and the
opcode they stand for."""
_FUSION_KINDS = {"loop", "input", "output", "custom"}


def _collective(opcode: str) -> str | None:
    base = opcode.removesuffix("-start").removesuffix("-done")
    return base if base in counts.COLLECTIVES else None


def _holds_matmul(module: Module, computation: str) -> bool:
    for inst in module.computations[computation]:
        if inst.opcode in ("dot", "convolution"):
            return True
        if any(_holds_matmul(module, name) for name in inst.callees().values()
               if name in module.computations and inst.opcode == "fusion"):
            return True
    return False


def category(inst: Instruction, module: Module | None = None) -> str:
    """The category of one top-level instruction; a fusion's is read from its body when
    `module` is given (else from its kind alone)."""
    opcode = inst.opcode
    if opcode in ("dot", "convolution"):
        return MATMUL
    if opcode == "fusion":
        body = inst.callees().get("calls")
        if module is not None and body in module.computations:
            if _holds_matmul(module, body):
                return MATMUL
            if module.root(body).opcode == "dynamic-update-slice":
                return UPDATE
        kind = _FUSION_KIND.search(inst.attributes)
        return f"fusion: {kind.group(1).lower() if kind else 'unknown kind'}"
    if (kind := _collective(opcode)) is not None:
        return f"collective: {kind}"
    if opcode == "custom-call":
        target = _TARGET.search(inst.attributes)
        return f"custom-call: {target.group(1) if target else 'unknown target'}"
    if opcode in _COPIES:
        return COPY
    if opcode == "dynamic-update-slice":
        return UPDATE
    if opcode in _HOST:
        return HOST
    if opcode in _CONTROL:
        return CONTROL
    if opcode in _NO_DATA:
        return NO_DATA
    return f"other: {opcode}"


def category_of_name(name: str, module: Module | None = None) -> str:
    """The category of the instruction a trace names `name`: the instruction's own where
    `module` holds it, else the one its name gives. XLA names an instruction after its
    opcode ("fusion.12", "all-gather-start.3"), and some fusions after what they hold, the
    kind first where it is named ("loop_multiply_fusion", "input_reduce_fusion.2"; a `dot`
    or `convolution` among the words is a matmul), or after the library that runs them
    (XLA:CPU's "ynn_fusion.3", YNNPACK's: `fusion: ynn`). A name that is neither is
    `other: <name less its number>` ("Thunk:#1" stays whole). XLA:CPU's `wrapped_<opcode>`
    (a fusion of one instruction) is that instruction's category."""
    if module is not None and name in module.by_name:
        return category(module.by_name[name], module)
    found = _OPCODE_OF_NAME.match(name)
    if found is None:
        base = _NUMBER.sub("", name.lstrip("%"))
        if base.startswith(_WRAPPED):  # XLA:CPU's fusion of one op: the op's category
            return category_of_name(base.removeprefix(_WRAPPED))
        fused = _NAMED_FUSION.match(base)
        if fused is None:
            return f"other: {base}"
        words = fused.group(1).split("_")
        if {"dot", "convolution"} & set(words):
            return MATMUL
        if words[0] in _FUSION_KINDS or len(words) == 1:  # a kind, or a library's fusion
            return f"fusion: {words[0]}"
        return "fusion: unknown kind"
    opcode = _TRACED_AS.get(found.group(1), found.group(1))
    stub = Instruction(name=name, shape="", opcode=opcode, operands=(), arguments="",
                       attributes="", root=False)
    return category(stub)


def by_category(hlo_text: str) -> dict[str, Totals]:
    """Every category's runs, matmul FLOPs, HBM bytes and collective bytes over one call of a
    compiled module (the figures of `harness.xla.counts.costs`, split), largest bytes
    first."""
    module = parse(hlo_text)
    found: dict[str, Totals] = {}
    for entry in counts.entries(module):
        totals = found.setdefault(category(entry.instruction, module), Totals())
        totals.count += entry.runs
        totals.flops += entry.costs.flops
        totals.hbm_bytes += entry.costs.hbm_bytes
        totals.collective_bytes += sum(entry.costs.collective_bytes.values())
    return dict(sorted(found.items(), key=lambda item: -item[1].hbm_bytes))


def per_step(texts: dict[str, str], calls: dict[str, int]) -> dict[str, dict[str, float]]:
    """A step's figures by category: `by_category` of each executable's HLO text times its
    calls per step, summed; as plain dicts (count, flops, hbm_bytes, collective_bytes) for
    a record. Empty where an executable's HLO cannot be counted (the record's other cost
    figures say why)."""
    found: dict[str, Totals] = {}
    try:
        for name, text in texts.items():
            if not calls.get(name):
                continue
            for key, totals in by_category(text).items():
                into = found.setdefault(key, Totals())
                for figure, value in dataclasses.asdict(totals).items():
                    setattr(into, figure, getattr(into, figure) + calls[name] * value)
    except counts.Unavailable:
        return {}
    return {key: dataclasses.asdict(totals) for key, totals in
            sorted(found.items(), key=lambda item: -item[1].hbm_bytes)}
