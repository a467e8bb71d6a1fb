"""The one reader of XLA's HLO text: an optimized module (`Compiled.as_text()`, or a
runtime executable's module printed without metadata) parsed into its computations and
instructions, each with its shape, opcode, operands, callees and attributes.

Everything parity counts from a compiled program is counted from this parse: what a plan
moves and computes on a TPU target (`harness.xla.counts`), XLA's own cost model re-run per
loop body (`harness.xla.compiled`), and the trip counts of loops (`harness.xla.loops`).
"""

from __future__ import annotations

import dataclasses
import math
import re

ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s4": 1, "u4": 1, "bf16": 2, "f16": 2, "s16": 2,
            "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8,
            "f8e4m3fn": 1, "f8e5m2": 1, "c64": 8, "c128": 16}
_ARRAY = re.compile(r"\b(" + "|".join(sorted(ITEMSIZE, key=len, reverse=True))
                    + r")\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY )?%?([\w.\-]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.+?) ([a-z][a-z0-9\-]*)\((.*)$")
_CALLEE = re.compile(r"\b(condition|body|calls|to_apply|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_CALLEE_SET = re.compile(r"\b(branch_computations|called_computations|calls)=\{([^}]*)\}")
_WHILE_LINE = re.compile(r"^\s+(?:ROOT )?\S+ = .*?\swhile\(", re.MULTILINE)


class Unavailable(Exception):  # noqa: N818 - a figure that is absent, not a fault
    """A figure cannot be counted from this text; the message says why."""


def array_bytes(shape: str, *, hbm_only: bool = False) -> int:
    """Logical bytes of the arrays in an HLO shape string (all of a tuple's); with
    `hbm_only`, only those in memory space 0 (no `S(n)` in their layout)."""
    total = 0
    for dtype, dims, layout in _ARRAY.findall(shape):
        if hbm_only and re.search(r"S\(\d+\)", layout or ""):
            continue
        total += ITEMSIZE[dtype] * math.prod(int(d) for d in dims.split(",") if d)
    return total


def dims(shape: str) -> list[int]:
    found = _ARRAY.search(shape)
    if found is None:
        raise Unavailable(f"no array in shape {shape[:60]!r}")
    return [int(d) for d in found.group(2).split(",") if d]


@dataclasses.dataclass(frozen=True)
class Instruction:
    name: str
    shape: str
    opcode: str
    operands: tuple[str, ...]
    arguments: str
    """The text inside the operand list (a constant's literal, a parameter's number)."""
    attributes: str
    """The text after the operand list (callees, dimensions, backend config)."""
    root: bool

    def callees(self) -> dict[str, str]:
        found = dict(_CALLEE.findall(self.attributes))
        for key, group in _CALLEE_SET.findall(self.attributes):
            names = [n.strip().lstrip("%") for n in group.split(",") if n.strip()]
            found.update({f"{key}[{i}]": n for i, n in enumerate(names)})
        return found

    def attribute(self, key: str) -> str | None:
        found = re.search(rf"\b{key}=([^,\s]+)", self.attributes)
        return found.group(1) if found else None


@dataclasses.dataclass(frozen=True)
class Module:
    computations: dict[str, list[Instruction]]
    """Computation name -> its instructions, in the text's order."""
    entry: str
    by_name: dict[str, Instruction]
    partitions: int = 1
    """Devices the SPMD program runs on (the header's num_partitions)."""
    lines: tuple[str, ...] = ()
    """The module's text, one line per entry."""
    header_line: dict[str, int] = dataclasses.field(default_factory=dict)
    """Computation name -> the index of its header line in `lines`."""

    def root(self, computation: str) -> Instruction:
        return next(i for i in self.computations[computation] if i.root)

    def with_entry(self, computation: str) -> str:
        """The module's text with `computation` as its ENTRY: a module whose whole cost is
        that of one run of `computation` (the other computations stay, unreachable). The
        header keeps only the partition and replica counts: the rest (the entry's layout,
        aliasing, `is_scheduled`) describes the old ENTRY's parameters."""
        lines = list(self.lines)
        kept = re.findall(r"\b(?:replica_count|num_partitions)=\d+", lines[0])
        lines[0] = ", ".join(["HloModule loop_cost", *kept])
        old = self.header_line[self.entry]
        lines[old] = lines[old].removeprefix("ENTRY ")
        new = self.header_line[computation]
        lines[new] = "ENTRY " + lines[new].removeprefix("ENTRY ")
        return "\n".join(lines)


def _split_operands(rest: str) -> tuple[list[str], str, str]:
    """(operand names, the operand list's text, the attribute text after it)."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch in "({":
            depth += 1
        elif ch in ")}":
            if depth == 0:
                return re.findall(r"%([\w.\-]+)", rest[:i]), rest[:i], rest[i + 1:]
            depth -= 1
    raise Unavailable(f"unbalanced operand list: {rest[:80]}")


def instruction(line: str) -> Instruction | None:
    """One instruction's line of HLO text (a TPU trace names each op so), None where `line`
    is not one."""
    found = _INSTRUCTION.match(line)
    if found is None:
        return None
    root, name, shape, opcode, rest = found.groups()
    try:
        operands, arguments, attributes = _split_operands(rest)
    except Unavailable:  # a trace may cut a long line short
        operands, arguments, attributes = [], "", ""
    return Instruction(name, shape, opcode, tuple(operands), arguments.strip(), attributes,
                       bool(root))


def short_shape(shape: str, arrays: int = 2) -> str:
    """An HLO shape without layouts or memory spaces, a tuple cut to its first `arrays`
    arrays: 'bf16[2,1024,1024]', '(s32[], bf16[2,1024,1024], ... 12 more)'."""
    found = [f"{dtype}[{dims}]" for dtype, dims, _ in _ARRAY.findall(shape)]
    if not shape.startswith("("):
        return found[0] if found else shape
    more = f", ... {len(found) - arrays} more" if len(found) > arrays else ""
    return f"({', '.join(found[:arrays])}{more})"


def _depth(text: str) -> int:
    """Brackets opened minus closed in `text`, outside double-quoted strings."""
    depth, quoted, escaped = 0, False, False
    for ch in text:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = quoted
        elif ch == '"':
            quoted = not quoted
        elif not quoted and ch in "({[":
            depth += 1
        elif not quoted and ch in ")}]":
            depth -= 1
    return depth


def logical_lines(hlo_text: str) -> list[str]:
    """The text's lines, each instruction on one: an instruction whose attributes run over
    several lines (a Pallas kernel's custom call carries a backend config with line breaks
    between its JSON fields) is joined into one line, the breaks made spaces."""
    lines: list[str] = []
    open_depth = 0
    for line in hlo_text.splitlines():
        if open_depth > 0:
            lines[-1] += " " + line.strip()
            open_depth += _depth(line)
        else:
            lines.append(line)
            if _INSTRUCTION.match(line):
                open_depth = _depth(line)
    return lines


def parse(hlo_text: str) -> Module:
    """The computations of an optimized HLO module's text (`Compiled.as_text()`)."""
    computations: dict[str, list[Instruction]] = {}
    header_line: dict[str, int] = {}
    entry, current = None, None
    lines = logical_lines(hlo_text)
    for index, line in enumerate(lines):
        if current is None:
            header = _HEADER.match(line)
            if header and not line.startswith("HloModule"):
                current = computations.setdefault(header.group(2), [])
                header_line[header.group(2)] = index
                entry = header.group(2) if header.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif found := _INSTRUCTION.match(line):
            root, name, shape, opcode, rest = found.groups()
            operands, arguments, attributes = _split_operands(rest)
            current.append(Instruction(name, shape, opcode, tuple(operands), arguments.strip(),
                                       attributes, bool(root)))
    if entry is None:
        raise Unavailable("no ENTRY computation: give the text of a compiled module")
    by_name = {i.name: i for body in computations.values() for i in body}
    whiles = sum(i.opcode == "while" for i in by_name.values())
    if whiles != len(_WHILE_LINE.findall(hlo_text)):  # a line the parser did not recognize
        raise Unavailable(f"the HLO text has {len(_WHILE_LINE.findall(hlo_text))} while "
                          f"instructions; the parser found {whiles}")
    partitions = re.search(r"\bnum_partitions=(\d+)", lines[0] if lines else "")
    return Module(computations, entry, by_name, int(partitions.group(1)) if partitions else 1,
                  tuple(lines), header_line)



def parameter_numbers(module: Module, computation: str) -> dict[str, int]:
    """Parameter instruction name -> its parameter number, in `computation`."""
    return {i.name: int(i.arguments) for i in module.computations[computation]
            if i.opcode == "parameter"}


def tuple_elements(shape: str) -> list[str]:
    """The element shapes of a (flat) tuple shape string."""
    inner = shape.strip()
    if not inner.startswith("("):
        return [inner]
    depth, start, parts = 0, 1, []
    for i, ch in enumerate(inner):
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
            if depth == 0:
                parts.append(inner[start:i])
        elif ch == "," and depth == 1:
            parts.append(inner[start:i])
            start = i + 1
    return [p.strip() for p in parts if p.strip()]

