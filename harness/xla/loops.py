"""How many times an HLO loop runs, read from the loop itself.

XLA:CPU annotates a while loop's proved trip count (`known_trip_count` in its backend
config); XLA:TPU does not, so there it is read from the loop: the condition compares the
induction variable with a constant, the body adds a constant step to it, and the loop's
initial tuple holds its constant start. A loop whose trip count cannot be read that way
raises `Unavailable`: a figure counted over it would be silently low.
"""

from __future__ import annotations

import re

from harness.xla.hlo import Instruction, Module, Unavailable, parameter_numbers

_PASS_THROUGH = {"bitcast", "reshape", "copy", "convert", "get-tuple-element"}
"""Instructions through which a value is the same integer (a constant or a loop index)."""


def _constant(module: Module, name: str) -> int | None:
    """The integer `name` holds, where it is (a pass-through of) a scalar constant."""
    inst = module.by_name.get(name)
    while inst is not None and inst.opcode in _PASS_THROUGH - {"get-tuple-element"}:
        inst = module.by_name.get(inst.operands[0])
    if inst is None or inst.opcode != "constant" or not re.fullmatch(r"-?\d+", inst.arguments):
        return None
    return int(inst.arguments)


def _tuple_index(module: Module, name: str) -> int | None:
    """k, where `name` is (a pass-through of) get-tuple-element(<the loop parameter>), index=k."""
    inst = module.by_name.get(name)
    while inst is not None and inst.opcode in _PASS_THROUGH - {"get-tuple-element"}:
        inst = module.by_name.get(inst.operands[0])
    if inst is None or inst.opcode != "get-tuple-element":
        return None
    source = module.by_name.get(inst.operands[0])
    if source is None or source.opcode != "parameter":
        return None
    return int(inst.attribute("index"))


def _compare(module: Module, computation: str) -> tuple[str, str, str]:
    """(lhs, rhs, direction) of a loop condition's compare, through a fusion wrapping it."""
    root = module.root(computation)
    if root.opcode == "fusion":
        inner = module.root(root.callees()["calls"])
        if inner.opcode != "compare":
            raise Unavailable(f"loop condition %{computation} is not a comparison")
        numbers = parameter_numbers(module, root.callees()["calls"])
        lhs, rhs = (root.operands[numbers[o]] if o in numbers else o for o in inner.operands)
        return lhs, rhs, inner.attribute("direction")
    if root.opcode != "compare":
        raise Unavailable(f"loop condition %{computation} is not a comparison")
    return root.operands[0], root.operands[1], root.attribute("direction")



def trip_count(module: Module, loop: Instruction) -> int:
    """How many times `loop` (a while) runs its body; Unavailable if it cannot be read."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.attributes)
    if known:
        return int(known.group(1))
    callees = loop.callees()
    lhs, rhs, direction = _compare(module, callees["condition"])
    index, bound = _tuple_index(module, lhs), _constant(module, rhs)
    if index is None or bound is None:  # `bound > i` spelled the other way round
        index, bound = _tuple_index(module, rhs), _constant(module, lhs)
        direction = {"GT": "LT", "GE": "LE", "LT": "GT", "LE": "GE"}.get(direction, direction)
    init_tuple = module.by_name.get(loop.operands[0])
    body_root = module.root(callees["body"])
    if index is None or bound is None or init_tuple is None or init_tuple.opcode != "tuple":
        raise Unavailable(f"the trip count of %{loop.name} cannot be read from its condition")
    start = _constant(module, init_tuple.operands[index])
    step = None
    if body_root.opcode == "tuple":
        update = module.by_name.get(body_root.operands[index])
        while update is not None and update.opcode in _PASS_THROUGH - {"get-tuple-element"}:
            update = module.by_name.get(update.operands[0])  # e.g. copy(add(i, 1))
        if update is not None and update.opcode == "add":
            a, b = update.operands
            step = (_constant(module, b) if _tuple_index(module, a) == index
                    else _constant(module, a) if _tuple_index(module, b) == index else None)
    if start is None or not step or direction not in ("LT", "LE", "NE"):
        raise Unavailable(f"the trip count of %{loop.name} cannot be read (start {start}, "
                          f"step {step}, comparison {direction})")
    end = bound + 1 if direction == "LE" else bound
    return max(0, -(-(end - start) // step))

