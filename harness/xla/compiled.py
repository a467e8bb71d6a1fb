"""XLA's cost of a compiled executable, corrected for loops.

`Compiled.cost_analysis()` is XLA's HloCostAnalysis of the optimized HLO; it costs a `while`
instruction as ONE run of its body and condition, because it does not read trip counts. A
program that scans (micro-batches under gradient accumulation, or layers under scan_layers)
is under-counted by the trip count. `compiled_cost` re-costs each loop body with the same cost
model and multiplies it by the loop's trip count (harness.xla.loops), recursively for nested
loops; when any loop's trip count cannot be read it returns None with a reason, never a
silently low number.
"""

from __future__ import annotations

import dataclasses
import math

import jax

from harness.xla.hlo import Instruction, Module, Unavailable, parse
from harness.xla.loops import trip_count


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompiledCost:
    """XLA's cost of one call of a compiled executable, with loops counted trip-count times.

    For an SPMD executable the HLO is the per-device program, so every number is per device.
    """

    flops: float | None
    """Loop-aware FLOPs; None when it cannot be known (see `reason`)."""
    bytes_accessed: float | None
    """Loop-aware sum of operand + output bytes of every top-level op; None as `flops`."""
    xla_flops: float | None
    """`Compiled.cost_analysis()['flops']`: every loop body counted once (None: no analysis)."""
    xla_bytes_accessed: float | None
    """`Compiled.cost_analysis()['bytes accessed']`: every loop body counted once."""
    trip_counts: list[int]
    """Trip counts of the loops reached from ENTRY, in pre-order (each loop before the
    loops nested in its body; siblings in HLO order). May be partial when `reason` is set."""
    reason: str | None = None
    """Why `flops`/`bytes_accessed` are None; None when they are given."""


_KEYS = ("flops", "bytes accessed")
_FOLLOWED = ("while", "call")
"""The instructions through which a loop's cost adds up per run (a conditional takes its
costliest branch; a fusion or reduction's callee runs inside one kernel)."""


def _xla_access(compiled: jax.stages.Compiled):
    """(HLO text of the compiled module, cost(text) -> XLA's cost-analysis dict).

    PRIVATE API (jax 0.11.2): `jaxlib._hlo` (HloPrintOptions, hlo_module_from_text) and
    `jax._src.lib._jax.hlo_module_cost_analysis(client, module)`, which runs the same
    HloCostAnalysis as `Compiled.cost_analysis()`. Everything private is used here only.
    """
    try:
        import jaxlib._hlo as hlo
        from jax._src.lib import _jax

        executable = compiled.runtime_executable()
        modules = executable.hlo_modules()
        options = hlo.HloPrintOptions()
        options.print_metadata = False  # shorter text; metadata has no cost
        text = modules[0].to_string(options) if len(modules) == 1 else None
        client, cost_analysis, parse_text = (executable.client, _jax.hlo_module_cost_analysis,
                                             hlo.hlo_module_from_text)
    except Exception as err:  # ImportError/AttributeError: the API moved; XlaRuntimeError
        raise Unavailable(f"jax's private HLO API failed: {err!r}") from err
    if text is None:
        raise Unavailable(f"the executable holds {len(modules)} HLO modules, not one")

    def cost(module_text: str) -> dict[str, float]:
        try:
            return dict(cost_analysis(client, parse_text(module_text)))
        except Exception as err:  # XlaRuntimeError from the parser or the cost model
            raise Unavailable(f"XLA could not cost a rewritten module: {err}") from err

    return text, cost


def _loops(module: Module) -> tuple[list[tuple[str, Instruction]], set[str]]:
    """((computation, while) for every loop reached from ENTRY in pre-order, the computations
    holding a loop at any depth). Raises for a loop reached through anything but while
    bodies/conditions and `call`: a loop in a conditional's branch, say, is not additive in
    XLA's cost model (it takes the costliest branch)."""
    has_loop: dict[str, bool] = {}

    def contains_loop(computation: str) -> bool:
        if computation not in has_loop:
            has_loop[computation] = False  # guards against cycles
            has_loop[computation] = any(
                i.opcode == "while" or any(contains_loop(c) for c in i.callees().values())
                for i in module.computations.get(computation, ()))
        return has_loop[computation]

    found, seen = [], set()

    def walk(computation: str) -> None:
        if computation in seen:
            return
        seen.add(computation)
        for instruction in module.computations.get(computation, ()):
            callees = instruction.callees()
            missing = [c for c in callees.values() if c not in module.computations]
            if missing:
                raise Unavailable(f"%{instruction.name} calls %{missing[0]}, which the HLO "
                                  "text parser did not find")
            if instruction.opcode == "while":
                found.append((computation, instruction))
            elif instruction.opcode not in _FOLLOWED:
                looped = [c for c in callees.values() if contains_loop(c)]
                if looped:
                    raise Unavailable(
                        f"a loop in %{looped[0]} is reached through {instruction.opcode} "
                        f"%{instruction.name}, whose cost XLA does not add up per run")
                continue
            for callee in callees.values():
                walk(callee)

    walk(module.entry)
    return found, {c for c in module.computations if contains_loop(c)}


def _trips(module: Module, loops: list[tuple[str, Instruction]]) -> dict[str, int]:
    """Loop name -> trip count; Unavailable naming every loop whose count cannot be read."""
    trips, unknown = {}, []
    for computation, loop in loops:
        try:
            trips[loop.name] = trip_count(module, loop)
        except Unavailable as err:
            unknown.append(f"%{loop.name} in %{computation} ({err})")
    if unknown:
        raise Unavailable(f"while {', '.join(unknown)} has no known trip count (its bound is "
                          "data-dependent or cannot be read); XLA counts its body once")
    return trips


def compiled_cost(compiled: jax.stages.Compiled) -> CompiledCost:
    """XLA's FLOPs and bytes accessed of one call of `compiled`, each loop counted as many
    times as it runs.

    With XLA(C) the cost analysis of one run of computation C (each while inside counted as
    one run of its body and condition), the true cost is, recursively,
        True(C) = XLA(C) + sum over whiles w in C of
                  [n_w * True(body_w) - XLA(body_w)] + [(n_w + 1) * True(cond_w) - XLA(cond_w)]
    with n_w the trip count: the body runs n_w times and the condition n_w + 1 times (once
    more, to exit). `call` instructions are followed (their cost is added once); `XLA(C)`
    comes from re-costing the module with C as its ENTRY.
    """
    raw = compiled.cost_analysis()
    xla = {key: float(raw.get(key, 0.0)) for key in _KEYS} if raw and "flops" in raw else None
    trips: list[int] = []

    def result(values: dict[str, float] | None, reason: str | None) -> CompiledCost:
        return CompiledCost(
            flops=values["flops"] if values else None,
            bytes_accessed=values["bytes accessed"] if values else None,
            xla_flops=xla["flops"] if xla else None,
            xla_bytes_accessed=xla["bytes accessed"] if xla else None,
            trip_counts=trips, reason=reason)

    if xla is None:
        return result(None, f"the executable has no cost analysis ({raw!r})")
    try:
        text, cost = _xla_access(compiled)
        module = parse(text)
        loops, looped = _loops(module)
        counts = _trips(module, loops)
        trips += [counts[loop.name] for _, loop in loops]
        if not loops:
            return result(dict(xla), None)
        return result(_loop_aware(module, cost, xla, looped, counts), None)
    except Unavailable as err:
        return result(None, str(err))


def _loop_aware(module: Module, cost, xla: dict[str, float], looped: set[str],
                trips: dict[str, int]) -> dict[str, float]:
    """True(ENTRY) by the recursion in `compiled_cost`'s docstring (`looped`: computations
    holding a loop; a call of any other one needs no correction)."""
    once: dict[str, dict[str, float]] = {}
    true: dict[str, dict[str, float]] = {}

    def xla_cost(computation: str) -> dict[str, float]:
        if computation not in once:
            analysis = cost(module.with_entry(computation))
            once[computation] = {key: float(analysis.get(key, 0.0)) for key in _KEYS}
        return once[computation]

    def true_cost(computation: str) -> dict[str, float]:
        if computation in true:
            return true[computation]
        total = dict(xla_cost(computation))
        for instruction in module.computations.get(computation, ()):
            callees = instruction.callees()
            if instruction.opcode == "while":
                n = trips[instruction.name]
                runs = {callees["body"]: n, callees["condition"]: n + 1}
            elif instruction.opcode == "call":
                runs = {c: 1 for c in callees.values() if c in looped}
            else:
                continue  # holds no loop: `_loops` checked
            for callee, count in runs.items():
                for key in _KEYS:
                    total[key] += count * true_cost(callee)[key] - xla_cost(callee)[key]
        true[computation] = total
        return total

    entry = xla_cost(module.entry)
    for key in _KEYS:  # the rewritten-module costs must be the executable's own cost model
        if not math.isclose(entry[key], xla[key], rel_tol=1e-6):
            raise Unavailable(
                f"re-costing the HLO text gives {key}={entry[key]:g}, the executable's cost "
                f"analysis {xla[key]:g}: the text round trip does not reproduce XLA's cost")
    return true_cost(module.entry)
