"""What holds an executable's planned memory, by the operation that defines each buffer:
XLA's own buffer assignment, read back from the files it writes beside a module it compiles
with `xla_dump_to` set.

An executable's planned total per device is argument + output + temp - alias
(`memory_analysis`). Its buffer assignment (`*after_optimizations-buffer-assignment.txt`)
lists every allocation (a parameter's, an output's, the temp heap, constants) with the
values placed in it and their sizes; its live ranges (`*after_optimizations-live-range.txt`,
section BufferLiveRange) give each value's first and last program point. From them the
total is split into rows of one section, defining operation and shape, summed:

- `argument`: the parameter allocations of the default memory space (the train state and
  the batch), by shape;
- `output`: the live-out allocations that are not a parameter's (an output not donated
  into an argument's buffer), by the category of the instruction that defines them
  (harness.xla.categories) and shape;
- `temp`: the values of the temp heap live at its busiest program point (where the most of
  its bytes are live at once), by defining category and shape; values live at one point
  never overlap in the heap, so they cannot sum past it (checked);
- and, per section, what XLA's total carries beyond the rows read from the assignment
  (`rest`: in temp, the heap's gaps and padding around the values live at its busiest
  point, which on XLA:TPU can be most of a small program's temp; negative where the dump
  holds more than the total counts).

The rows therefore sum to the planned total to the byte by construction, and a `rest` row
says how much of it the dumped assignment does not account for, instead of hiding it. Rows
of the same section, category and shape are one group (28 layers' weights are one row), so
two plans of one cell match row to row.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path

from harness.xla import categories
from harness.xla.hlo import Instruction, Module, Unavailable, parse, tuple_elements

VERSION = 4
"""Of how rows are read from a dump: a plan cached under another is compiled again (the
dump is not kept, only the rows)."""
LIVE_RANGE_SUFFIX = "after_optimizations-live-range.txt"
ASSIGNMENT_SUFFIX = "after_optimizations-buffer-assignment.txt"
HLO_SUFFIX = "after_optimizations.txt"
_ALLOCATION = re.compile(r"^allocation \d+: size (\d+),(.*):$")
_VALUE = re.compile(r"^ value: <\d+ ([^\s{]+)(?:\{([\d,]*)\})?(?: \(phi\))? @\d+> "
                    r"\(size=(\d+),offset=\d+\): (.*)$")
_RANGE = re.compile(r"^\s*(\S+?)\{([\d,]*)\}:(\d+)-(\d+)\s*$")
_COLOR = re.compile(r"\bcolor (\d+)")
_PARAMETER = re.compile(r"\bparameter \d+")
_LAYOUT = re.compile(r"\{[^{}]*\}")
_COMMENT = re.compile(r"/\*.*?\*/")
ARGUMENT, OUTPUT, TEMP = "argument", "output", "temp"
PARAMETER = "parameter"
REST = "rest"
"""The `defined_by` of a section's remainder row."""


@dataclasses.dataclass(frozen=True)
class Group:
    """Buffers of one section of the planned total that share a defining category and
    shape."""

    section: str
    """argument, output or temp."""
    defined_by: str
    shape: str
    """The buffer's array shape without its layout, e.g. `bf16[1024,3072]`."""
    count: int
    bytes: int


@dataclasses.dataclass(frozen=True)
class Allocation:
    size: int
    section: str | None
    """argument, output or temp (None: another kind, e.g. a constant or thread-local)."""
    values: tuple[tuple[str, str, str, int], ...]
    """(instruction name, tuple index, shape with layout, bytes) of each value placed in
    it."""


def dump_options(directory: str | Path) -> dict:
    """Compiler options that make XLA write a compiled module's buffer assignment, live
    ranges included, under `directory`."""
    return {"xla_dump_to": str(directory)}


def dumped(directory: str | Path, suffix: str) -> Path:
    """The one module's dump ending in `suffix` under `directory`; Unavailable if there is
    none or more than one (one compile per directory)."""
    found = sorted(Path(directory).glob(f"*{suffix}"))
    if len(found) != 1:
        raise Unavailable(f"{len(found)} *{suffix} dumps under {directory} (expected 1)")
    return found[0]


def allocations(text: str) -> list[Allocation]:
    """The default memory space's allocations of a buffer-assignment dump."""
    found, current = [], None
    for line in text.splitlines():
        if (head := _ALLOCATION.match(line)) is not None:
            color = _COLOR.search(head.group(2))
            attributes = head.group(2)
            section = (ARGUMENT if _PARAMETER.search(attributes)
                       else OUTPUT if "maybe-live-out" in attributes
                       else TEMP if "preallocated-temp" in attributes else None)
            current = [] if color is None or color.group(1) == "0" else None
            if current is not None:
                found.append((int(head.group(1)), section, current))
        elif current is not None and (value := _VALUE.match(line)) is not None:
            current.append((value.group(1), value.group(2) or "", value.group(4),
                            int(value.group(3))))
    return [Allocation(size, section, tuple(values)) for size, section, values in found]


def live_ranges(text: str) -> dict[tuple[str, str], tuple[int, int]]:
    """(instruction name, tuple index) -> (first, last) program point of each buffer, from
    the dump's BufferLiveRange section."""
    found, inside = {}, False
    for line in text.splitlines():
        if line.strip() == "BufferLiveRange:":
            inside = True
        elif inside and (live := _RANGE.match(line)) is not None:
            found[live.group(1), live.group(2)] = (int(live.group(3)), int(live.group(4)))
        elif inside:
            break
    return found


def _live(span: tuple[int, int]) -> tuple[int, int]:
    """A buffer's live points as a half-open range [first, end): at the point where an
    instruction writes its result into its operand's buffer (in place), the result is live
    and the operand is not; a buffer defined and last used at one point is live there."""
    first, last = span
    return first, max(last, first + 1)


def busiest_temp(placed: list[Allocation], live_range_text: str
                 ) -> list[tuple[str, str, str, int]]:
    """The values of the temp allocation live at the program point where the most of its
    bytes are live: (name, index, shape, bytes) each. Unavailable where those bytes exceed
    the allocation (values live at once cannot overlap in it: a second count of the dump)."""
    spans = {key: _live(span) for key, span in live_ranges(live_range_text).items()}
    temp = [(a, v) for a in placed if a.section == TEMP for v in a.values
            if (v[0], v[1]) in spans]
    if not temp:
        return []
    events: dict[int, int] = {}
    for _, (name, index, _, size) in temp:
        first, end = spans[name, index]
        events[first] = events.get(first, 0) + size
        events[end] = events.get(end, 0) - size
    live, best, at = 0, -1, 0
    for point in sorted(events):
        live += events[point]
        if live > best:
            best, at = live, point
    chosen = [(a, v) for a, v in temp if spans[v[0], v[1]][0] <= at < spans[v[0], v[1]][1]]
    for allocation in {id(a): a for a, _ in chosen}.values():
        held = sum(v[3] for a, v in chosen if a is allocation)
        if held > allocation.size:
            raise Unavailable(f"{held} bytes live at once in a temp allocation of "
                              f"{allocation.size}")
    return [v for _, v in chosen]


def _defined(module: Module | None, name: str, index: str, shape: str) -> tuple[str, str]:
    """(defining category, shape without layout) of value `name{index}`; `shape` is the
    dump's where the HLO does not hold the instruction."""
    inst = module.by_name.get(name) if module is not None else None
    if inst is None:
        return categories.category_of_name(name), _plain(shape)
    shape = inst.shape
    for position in (int(i) for i in index.split(",") if i):
        elements = tuple_elements(shape)
        shape = elements[position] if position < len(elements) else "?"
    return _what(inst, module), _plain(shape)


def _what(inst: Instruction, module: Module) -> str:
    """The category of the instruction defining a buffer; a wrapper that runs a
    computation (an async start/done, XLA:TPU7x's custom-call around a collective) is
    named by what its computation's root does."""
    if inst.opcode == "parameter":
        return PARAMETER
    if inst.opcode in categories.ASYNC or inst.opcode == "custom-call":
        for body in inst.callees().values():
            if body in module.computations and module.root(body) is not inst:
                return _what(module.root(body), module)
        if inst.opcode in categories.ASYNC:  # named after what it runs ("all-gather.3.call-done")
            named = categories.category_of_name(inst.name.split(".")[0])
            if not named.startswith("other: "):
                return named
    return categories.category(inst, module)


def _plain(shape: str) -> str:
    """A shape without its layout; a tuple (a loop's state, an output's index table) as
    `tuple of N`."""
    shape = _COMMENT.sub("", shape).strip()
    if shape.startswith("("):
        return f"tuple of {len(tuple_elements(shape))}"
    return _LAYOUT.sub("", shape).strip()


def decompose(assignment_text: str, live_range_text: str, hlo_text: str | None,
              memory: dict[str, int]) -> list[Group]:
    """The executable's planned total (argument + output + temp - alias of `memory`, XLA's
    memory analysis) as rows, the largest first; see the module docstring."""
    try:
        module = parse(hlo_text) if hlo_text else None
    except Unavailable:
        module = None
    placed = allocations(assignment_text)
    rows: dict[tuple[str, str, str], list[int]] = {}

    def add(section: str, what: tuple[str, str], size: int) -> None:
        tally = rows.setdefault((section, *what), [0, 0])
        tally[0] += 1
        tally[1] += size

    for allocation in placed:
        if allocation.section in (ARGUMENT, OUTPUT) and allocation.values:
            name, index, shape, _ = allocation.values[-1]
            what = ((PARAMETER, _plain(shape))
                    if allocation.section == ARGUMENT else _defined(module, name, index, shape))
            add(allocation.section, what, allocation.size)
    for name, index, shape, size in busiest_temp(placed, live_range_text):
        add(TEMP, _defined(module, name, index, shape), size)
    totals = {ARGUMENT: memory["argument_size_in_bytes"],
              OUTPUT: memory["output_size_in_bytes"] - memory["alias_size_in_bytes"],
              TEMP: memory["temp_size_in_bytes"]}
    found = [Group(section, what, shape, count, size)
             for (section, what, shape), (count, size) in rows.items()]
    for section, total in totals.items():
        rest = total - sum(g.bytes for g in found if g.section == section)
        if rest:
            found.append(Group(section, REST, "", 0, rest))
    return sorted(found, key=lambda g: (-g.bytes, g.section, g.defined_by, g.shape))


def from_dump(directory: str | Path, hlo_text: str | None,
              memory: dict[str, int]) -> list[Group]:
    """`decompose` of the one module XLA dumped under `directory`, its instructions read
    from the optimized module dumped beside the assignment (the names the assignment uses;
    a backend's `Compiled.as_text()` can leave out the computations an async wrapper
    runs), else from `hlo_text`."""
    with contextlib.suppress(Unavailable):
        hlo_text = dumped(directory, HLO_SUFFIX).read_text()
    return decompose(dumped(directory, ASSIGNMENT_SUFFIX).read_text(),
                     dumped(directory, LIVE_RANGE_SUFFIX).read_text(), hlo_text, memory)
