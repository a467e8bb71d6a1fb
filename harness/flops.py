"""FLOPs of a training step: the analytic model count (MaxText's convention) and XLA's cost
of a compiled executable corrected for loops.

Model FLOPs. A matmul of an (M, K) by a (K, N) matrix does M*N*K multiply-adds, 2*M*N*K
FLOPs. A token passing through a weight matrix of shape (K, N) therefore costs 2*K*N FLOPs
forward. Backward needs two matmuls of the same size per weight (the gradient with respect to
the input, dL/dx = dL/dy W^T, and with respect to the weight, dL/dW = x^T dL/dy), so a training
step costs 3x the forward matmuls: fwd + 2x fwd. Attention adds matmuls that have no weight:
scores Q K^T and context P V, 2*S*H FLOPs each per query token and head, 4*B*S^2*N*H for the
whole batch; with a causal mask a query sees on average half the keys, so the useful work is
half of that (Megatron/NeMo/MaxText all divide by 2, whatever the kernel really computes).
The embedding lookup is a gather (no arithmetic) and is not counted; the output head (the
unembedding, tied or not) is a D x V matmul and is. Norms, RoPE, softmax and the SwiGLU gate
product are elementwise, a vanishing share, and are left out, as is remat's recomputation:
this is the "model FLOPs" of MFU, the work the model needs, not the work an engine happens to
do, so it is the same with or without scan, remat, gradient accumulation or sharding.

Compiled cost. `Compiled.cost_analysis()` is XLA's HloCostAnalysis of the optimized HLO; it
costs a `while` instruction as ONE run of its body and condition, because it does not read trip
counts. A program that scans (micro-batches under gradient accumulation, or layers under
scan_layers) is under-counted by the trip count. `compiled_cost` re-costs each loop body with
the same cost model and multiplies it by the trip count XLA's loop analysis proved
(`known_trip_count` in the while's backend_config), recursively for nested loops; when any loop
has no known trip count it returns None with a reason, never a silently low number.
"""

from __future__ import annotations

import dataclasses
import math
import re

import jax

from engine.model import DecoderConfig

SWIGLU_IN_PROJECTIONS = 2
"""SwiGLU's MLP has two input projections (gate wi_0, up wi_1) and one output (wo)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFlops:
    """Analytic training FLOPs of one optimizer step, fwd + bwd, summed over all devices."""

    weights: float
    """Matmuls with a learnable weight (qkv, attention out, MLP, output head), x3."""
    attention: float
    """Causal attention's weight-less matmuls (scores and context, halved for the mask), x3."""

    @property
    def total(self) -> float:
        """weights + attention: the numerator of MFU."""
        return self.weights + self.attention


def model_flops(config: DecoderConfig, *, batch: int, seq: int) -> ModelFlops:
    """MaxText's `calculate_tflops_training_per_device` (dense branch) for `batch` rows of
    `seq` tokens, in FLOPs and over the whole step (MaxText's numbers are per device for
    per_device_batch_size rows: ours = theirs * 1e12 * number of devices)."""
    if batch <= 0 or seq <= 0:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    tokens = batch * seq
    D, N, K, H = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
    mlp = 2 * tokens * config.mlp_dim * D * (SWIGLU_IN_PROJECTIONS + 1)
    qkv = 2 * tokens * D * (N + 2 * K) * H
    out_projection = 2 * tokens * D * N * H
    causal_attention = 4 * batch * seq**2 * N * H / 2
    unembedding = 2 * tokens * D * config.vocab_size
    per_layer = mlp + qkv + out_projection
    return ModelFlops(weights=3.0 * (per_layer * config.num_layers + unembedding),
                      attention=3.0 * causal_attention * config.num_layers)


def model_flops_per_step(config: DecoderConfig, *, batch: int, seq: int) -> float:
    """Total training FLOPs of one optimizer step over batch*seq tokens (see `model_flops`)."""
    return model_flops(config, batch=batch, seq=seq).total


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
    """Known trip counts of the loops reached from ENTRY, in pre-order (each loop before the
    loops nested in its body; siblings in HLO order). May be partial when `reason` is set."""
    reason: str | None = None
    """Why `flops`/`bytes_accessed` are None; None when they are given."""


class _UnavailableError(Exception):
    """The loop-aware cost cannot be given; the message says why."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Instruction:
    name: str
    """The instruction's name, without '%'."""
    opcode: str
    """HLO opcode, e.g. 'while', 'call', 'fusion'."""
    callees: dict[str, str]
    """Computations it calls, keyed by the attribute naming them ('body', 'calls', ...)."""
    trip_count: int | None
    """A while's `known_trip_count`; None if XLA did not prove one (or not a while)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Module:
    lines: list[str]
    """The module's HLO text, one line per entry."""
    header_line: dict[str, int]
    """Computation name -> index of its header line in `lines`."""
    instructions: dict[str, list[_Instruction]]
    """Computation name -> its instructions that call other computations, in HLO order."""
    entry: str
    """Name of the ENTRY computation."""


_HEADER = re.compile(r"^(ENTRY )?%?([^\s(]+) \(.*\{\s*$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?([^\s=]+) = (.*)$")
_OPCODE = re.compile(r"(?:^|\s)([a-z][a-z0-9-]*)\(")
_ONE_CALLEE = re.compile(
    r"\b(body|condition|calls|to_apply|true_computation|false_computation)=%?([\w.\-]+)")
_CALLEE_SET = re.compile(r"\b(branch_computations|called_computations|calls)=\{([^}]*)\}")
_WHILE_LINE = re.compile(r"^\s+(?:ROOT )?\S+ = .*?\swhile\(", re.MULTILINE)
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _parse(text: str) -> _Module:
    """The computations of an HLO module's text and their calling instructions."""
    lines = text.splitlines()
    header_line, instructions, entry, current = {}, {}, None, None
    for index, line in enumerate(lines):
        if current is None:
            match = _HEADER.match(line)
            if match and not line.startswith("HloModule"):
                current = match.group(2)
                header_line[current], instructions[current] = index, []
                entry = current if match.group(1) else entry
        elif line.startswith("}"):
            current = None
        elif match := _INSTRUCTION.match(line):
            rest = match.group(2)
            callees = dict(_ONE_CALLEE.findall(rest))
            for key, group in _CALLEE_SET.findall(rest):
                names = [n.strip().lstrip("%") for n in group.split(",") if n.strip()]
                callees.update({f"{key}[{i}]": name for i, name in enumerate(names)})
            if callees:
                opcode, trip = _OPCODE.search(rest), _TRIP_COUNT.search(rest)
                instructions[current].append(_Instruction(
                    name=match.group(1), opcode=opcode.group(1) if opcode else "?",
                    callees=callees, trip_count=int(trip.group(1)) if trip else None))
    if entry is None:
        raise _UnavailableError("the HLO text has no ENTRY computation")
    parsed = sum(i.opcode == "while" for found in instructions.values() for i in found)
    if parsed != len(_WHILE_LINE.findall(text)):  # a computation the parser did not recognize
        raise _UnavailableError(f"the HLO text has {len(_WHILE_LINE.findall(text))} while "
                                f"instructions; the parser found {parsed}")
    return _Module(lines=lines, header_line=header_line, instructions=instructions, entry=entry)


def _as_entry(module: _Module, computation: str) -> str:
    """The module's text with `computation` as ENTRY: a module whose whole cost is that of one
    run of `computation` (the other computations stay, unreachable, and cost nothing)."""
    lines = list(module.lines)
    kept = re.findall(r"\b(?:replica_count|num_partitions)=\d+", lines[0])
    # entry_computation_layout, aliasing and sharding-propagation attributes describe the old
    # ENTRY's parameters; `is_scheduled` is dropped so no schedule is checked against it.
    lines[0] = ", ".join(["HloModule loop_cost", *kept])
    old = module.header_line[module.entry]
    lines[old] = lines[old].removeprefix("ENTRY ")
    new = module.header_line[computation]
    lines[new] = "ENTRY " + lines[new].removeprefix("ENTRY ")
    return "\n".join(lines)


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
        raise _UnavailableError(f"jax's private HLO API failed: {err!r}") from err
    if text is None:
        raise _UnavailableError(f"the executable holds {len(modules)} HLO modules, not one")

    def cost(module_text: str) -> dict[str, float]:
        try:
            return dict(cost_analysis(client, parse_text(module_text)))
        except Exception as err:  # XlaRuntimeError from the parser or the cost model
            raise _UnavailableError(f"XLA could not cost a rewritten module: {err}") from err

    return text, cost


_KEYS = ("flops", "bytes accessed")


def _loops(module: _Module) -> tuple[list[tuple[str, _Instruction]], set[str]]:
    """((computation, while) for every loop reached from ENTRY in pre-order, the computations
    holding a loop at any depth). Raises for a loop reached through anything but while
    bodies/conditions and `call`: a loop in a conditional's branch, say, is not additive in
    XLA's cost model (it takes the costliest branch)."""
    has_loop: dict[str, bool] = {}

    def contains_loop(computation: str) -> bool:
        if computation not in has_loop:
            has_loop[computation] = False  # guards against cycles
            has_loop[computation] = any(
                i.opcode == "while" or any(contains_loop(c) for c in i.callees.values())
                for i in module.instructions.get(computation, ()))
        return has_loop[computation]

    found, seen = [], set()

    def walk(computation: str) -> None:
        if computation in seen:
            return
        seen.add(computation)
        for instruction in module.instructions.get(computation, ()):
            missing = [c for c in instruction.callees.values() if c not in module.header_line]
            if missing:
                raise _UnavailableError(f"%{instruction.name} calls %{missing[0]}, which the "
                                        "HLO text parser did not find")
            if instruction.opcode == "while":
                if instruction.callees.keys() != {"body", "condition"}:
                    raise _UnavailableError(f"while %{instruction.name} names no body/condition")
                found.append((computation, instruction))
            elif instruction.opcode != "call":
                looped = [c for c in instruction.callees.values() if contains_loop(c)]
                if looped:
                    raise _UnavailableError(
                        f"a loop in %{looped[0]} is reached through {instruction.opcode} "
                        f"%{instruction.name}, whose cost XLA does not add up per run")
                continue
            for callee in instruction.callees.values():
                walk(callee)

    walk(module.entry)
    return found, {c for c in module.instructions if contains_loop(c)}


def compiled_cost(compiled: jax.stages.Compiled) -> CompiledCost:
    """XLA's FLOPs and bytes accessed of one call of `compiled`, each loop counted as many
    times as it runs.

    With XLA(C) the cost analysis of one run of computation C (each while inside counted as
    one run of its body and condition), the true cost is, recursively,
        True(C) = XLA(C) + sum over whiles w in C of
                  [n_w * True(body_w) - XLA(body_w)] + [(n_w + 1) * True(cond_w) - XLA(cond_w)]
    with n_w the known trip count: the body runs n_w times and the condition n_w + 1 times
    (once more, to exit). `call` instructions are followed (their cost is added once);
    `XLA(C)` comes from re-costing the module with C as its ENTRY.
    """
    raw = compiled.cost_analysis()
    raw = (raw[0] if raw else None) if isinstance(raw, list | tuple) else raw  # older jax
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
        module = _parse(text)
        loops, looped = _loops(module)
        trips += [w.trip_count for _, w in loops if w.trip_count is not None]
        unknown = [f"%{w.name} in %{c}" for c, w in loops if w.trip_count is None]
        if unknown:
            raise _UnavailableError(
                f"while {', '.join(unknown)} has no known trip count (its bound is data-"
                "dependent or XLA could not prove it); XLA counts its body once")
        if not loops:
            return result(dict(xla), None)
        return result(_loop_aware(module, cost, xla, looped), None)
    except _UnavailableError as err:
        return result(None, str(err))


def _loop_aware(module: _Module, cost, xla: dict[str, float],
                looped: set[str]) -> dict[str, float]:
    """True(ENTRY) by the recursion in `compiled_cost`'s docstring (`looped`: computations
    holding a loop; a call of any other one needs no correction)."""
    once: dict[str, dict[str, float]] = {}
    true: dict[str, dict[str, float]] = {}

    def xla_cost(computation: str) -> dict[str, float]:
        if computation not in once:
            analysis = cost(_as_entry(module, computation))
            once[computation] = {key: float(analysis.get(key, 0.0)) for key in _KEYS}
        return once[computation]

    def true_cost(computation: str) -> dict[str, float]:
        if computation in true:
            return true[computation]
        total = dict(xla_cost(computation))
        for instruction in module.instructions.get(computation, ()):
            if instruction.opcode == "while":
                runs = {instruction.callees["body"]: instruction.trip_count,
                        instruction.callees["condition"]: instruction.trip_count + 1}
            elif instruction.opcode == "call":
                runs = {c: 1 for c in instruction.callees.values() if c in looped}
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
            raise _UnavailableError(
                f"re-costing the HLO text gives {key}={entry[key]:g}, the executable's cost "
                f"analysis {xla[key]:g}: the text round trip does not reproduce XLA's cost")
    return true_cost(module.entry)

