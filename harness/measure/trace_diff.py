"""Two captures of one cell side by side: per device, each op's and each category's device
time per traced step, the movers, the ops of one side only, and each side's step split into
compute, collectives, copies and idle.

A capture's steps are its step annotations (one window where it has none). An op belongs to
the step its start falls in (harness.measure.trace.parse_steps does the same), and its time
is its interval's length (copies included: a copy's time is device time too). Control flow
(a while, conditional or call) is left out: its event encloses its body's ops, which are
counted themselves. A device is
matched across the sides by its plane name, an op by its HLO op name, so two captures of one
program line up op by op; two programs (two arms) line up by category.

Whether a change is beyond noise is decided by `reports.trace_noise.beyond_step_noise`, from each
side's own steps, with the process spread of the backend both captures ran on (a TPU's
where every device is a TPU). A category absent from one side costs that side 0 ms a step
(two programs line up by category, so its absence is a reading); an op of one side only is
listed as such, not compared.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

from harness.measure import xplane
from harness.xla import categories
from reports import trace_noise


@dataclasses.dataclass(frozen=True)
class Side:
    """One capture, per device and traced step."""

    label: str
    steps: int
    """Traced steps (windows) the figures are per."""
    ops: dict[tuple[str, str], list[float]]
    """(device, op name) -> its ms in each step."""
    categories: dict[tuple[str, str], list[float]]
    """(device, category) -> the ms of its ops in each step."""
    breakdown: dict[str, dict[str, float]]
    """device -> compute, collectives, copies, idle and span: mean ms per step, the first
    four adding up to the span (xplane.breakdown_ns over each step's window)."""


def op_category(op: xplane.Op) -> str:
    """A memory copy is a host transfer; any other op the category its HLO name gives."""
    return categories.HOST if op.memcpy else categories.category_of_name(op.name)


def read_side(path: str, label: str) -> Side:
    """`path`'s capture per device and step. ValueError where it holds no op."""
    capture = xplane.read(path)
    if not capture.ops:
        raise ValueError(f"{path}: the capture holds no device op; trace a cell that ran")
    windows = [(begin, end) for _, begin, end in capture.steps] or [
        (min(op.start for op in capture.ops), max(op.end for op in capture.ops))]
    ops: dict = defaultdict(lambda: [0.0] * len(windows))
    cats: dict = defaultdict(lambda: [0.0] * len(windows))
    by_device: dict[str, list[xplane.Op]] = defaultdict(list)
    for op in capture.ops:
        by_device[op.device].append(op)
        index = _window(op.start, windows)
        category = op_category(op)
        if index is None or category == categories.CONTROL:
            continue
        ms = (op.end - op.start) / 1e6
        ops[(op.device, op.name)][index] += ms
        cats[(op.device, category)][index] += ms
    breakdown = {}
    for device, mine in by_device.items():
        parts = [xplane.breakdown_ns(mine, begin, end) for begin, end in windows]
        mean = {k: sum(p[k] for p in parts) / len(parts) / 1e6 for k in xplane.BREAKDOWN}
        mean["span"] = sum(end - begin for begin, end in windows) / len(windows) / 1e6
        breakdown[device] = mean
    return Side(label=label, steps=len(windows), ops=dict(ops), categories=dict(cats),
                breakdown=breakdown)


def _window(start: float, windows: list[tuple[float, float]]) -> int | None:
    """The index of the first window [begin, end] holding `start` (None: none does)."""
    return next((i for i, (begin, end) in enumerate(windows) if begin <= start <= end), None)


@dataclasses.dataclass(frozen=True)
class Mover:
    device: str
    name: str
    """An op name, or a category."""
    category: str
    a: list[float]
    b: list[float]
    """ms in each step of each side (empty where the side has none)."""
    beyond_noise: bool

    @property
    def a_ms(self) -> float:
        return sum(self.a) / len(self.a) if self.a else 0.0

    @property
    def b_ms(self) -> float:
        return sum(self.b) / len(self.b) if self.b else 0.0

    @property
    def change_ms(self) -> float:
        return self.b_ms - self.a_ms

    @property
    def median_change_ms(self) -> float:
        """The change of the median step (0 for a side without the op): what movers are
        ranked by, so one slow step ranks nothing first."""
        return (statistics.median(self.b) if self.b else 0.0) - (
            statistics.median(self.a) if self.a else 0.0)


@dataclasses.dataclass(frozen=True)
class TraceExplanation:
    a: Side
    b: Side
    ops: list[Mover]
    """Every op of either side, the largest change of the median step first."""
    categories: list[Mover]
    only_a: list[tuple[str, str]]
    only_b: list[tuple[str, str]]
    """(device, op) that ran on one side only."""
    backend: str | None = None
    """"tpu" where every device of both captures is a TPU, else None (the CPU machine's
    process spread decides)."""


def _movers(a: dict, b: dict, spans: dict[str, float], name_category, backend: str | None,
            absent: tuple[list[float], list[float]] = ([], [])) -> list[Mover]:
    """Every key of either side; a key one side lacks takes `absent`'s list for that side
    (empty: not compared; a category passes 0 ms for each of the side's steps)."""
    found = []
    for key in dict.fromkeys([*a, *b]):
        device, name = key
        sa, sb = a.get(key, absent[0]), b.get(key, absent[1])
        beyond = bool(sa and sb) and trace_noise.beyond_step_noise(sa, sb, spans.get(device, 0.0),
                                                             backend)
        found.append(Mover(device=device, name=name, category=name_category(name),
                           a=sa, b=sb, beyond_noise=beyond))
    found.sort(key=lambda m: (-abs(m.median_change_ms), -abs(m.change_ms)))
    return found


def backend_of(*sides: Side) -> str | None:
    """"tpu" where every device the sides ran on is a TPU (plane names /device:TPU:N)."""
    devices = [d for side in sides for d in side.breakdown]
    return "tpu" if devices and all(":TPU:" in d for d in devices) else None


def explain(a: Side, b: Side) -> TraceExplanation:
    """What changed from capture `a` to capture `b`, by op and by category."""
    spans = {d: max(a.breakdown.get(d, {}).get("span", 0.0),
                    b.breakdown.get(d, {}).get("span", 0.0))
             for d in dict.fromkeys([*a.breakdown, *b.breakdown])}
    backend = backend_of(a, b)
    return TraceExplanation(
        a=a, b=b,
        ops=_movers(a.ops, b.ops, spans, categories.category_of_name, backend),
        categories=_movers(a.categories, b.categories, spans, lambda name: name, backend,
                           absent=([0.0] * a.steps, [0.0] * b.steps)),
        only_a=[k for k in a.ops if k not in b.ops], only_b=[k for k in b.ops if k not in a.ops],
        backend=backend)


def markdown(found: TraceExplanation, top: int | None = None) -> str:
    """The breakdown per device and side, then the categories and the `top` op movers."""
    a, b = found.a, found.b
    lines = [f"A: {a.label} ({a.steps} traced steps)", f"B: {b.label} ({b.steps} traced steps)",
             "", "Device time per traced step (mean over the steps; movers ranked by the "
             "change of the median step). A change is beyond noise where "
             + trace_noise.step_noise_rule(found.backend) + ".", "",
             "| device | side | span ms | " + " | ".join(f"{k} ms (share)" for k in
                                                       xplane.BREAKDOWN) + " |",
             "|---|---|---|---|---|---|---|"]
    for device in dict.fromkeys([*a.breakdown, *b.breakdown]):
        for label, side in (("A", a), ("B", b)):
            part = side.breakdown.get(device)
            if part is None:
                continue
            shares = " | ".join(f"{part[k]:.3f} ({part[k] / part['span']:.1%})"
                                if part["span"] else f"{part[k]:.3f}" for k in xplane.BREAKDOWN)
            lines.append(f"| {device} | {label} | {part['span']:.3f} | {shares} |")
    for title, movers in (("By category", found.categories), ("By op", found.ops)):
        lines += ["", f"{title}, the largest movers first:", "",
                  "| device | " + ("category" if title == "By category" else "op | category")
                  + " | A ms/step | B ms/step | B-A ms | A steps | B steps | beyond noise |",
                  "|---|---|---|---|---|---|---|---|" + ("" if title == "By category" else "---|")]
        for m in movers[:top]:
            name = m.name if title == "By category" else f"{m.name} | {m.category}"
            lines.append(f"| {m.device} | {name} | {m.a_ms:.3f} | {m.b_ms:.3f} | "
                         f"{m.change_ms:+.3f} | {_steps(m.a)} | {_steps(m.b)} | "
                         f"{'yes' if m.beyond_noise else 'no'} |")
    for label, keys in (("A", found.only_a), ("B", found.only_b)):
        if keys:
            shown = ", ".join(f"{op} ({device})" for device, op in keys[:top])
            more = f" and {len(keys) - top} more" if top and len(keys) > top else ""
            lines.append(f"\nOps only in {label}: {shown}{more}.")
    return "\n".join(lines) + "\n"


def _steps(values: list[float]) -> str:
    return " ".join(f"{v:.3f}" for v in values) if values else "-"


def to_json(found: TraceExplanation, top: int | None = None) -> dict:
    def rows(movers):
        return [{"device": m.device, "name": m.name, "category": m.category, "a_ms": m.a,
                 "b_ms": m.b, "change_ms": m.change_ms, "beyond_noise": m.beyond_noise}
                for m in movers[:top]]

    return {"a": {"label": found.a.label, "steps": found.a.steps,
                  "breakdown_ms": found.a.breakdown},
            "b": {"label": found.b.label, "steps": found.b.steps,
                  "breakdown_ms": found.b.breakdown},
            "categories": rows(found.categories), "ops": rows(found.ops),
            "only_a": [list(k) for k in found.only_a], "only_b": [list(k) for k in found.only_b]}
