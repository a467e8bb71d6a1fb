"""What an explanation may claim: the movers are what differs; a cause needs an intervention.

An explanation (`parity explain`, and the block under each regressed cell of `compare`,
`ab`, `nightly`, `bisect` and a report's baseline section) lists movers: the operation
categories or ops whose compiled figures or device time differ between two sides. They say
what differs, and where to look; they do not say why the time moved. On the TPU v5e, the op
diff of PeftTrainer against our engine named the decoder's layer scan (17 ms a step of
dynamic-update-slice, slices and converts); without the scan (`--no-scan-layers`) the arms
moved 101-121 GB a step against 78-79 and ran slower (the engine 116.7 ms against 115.0),
not faster: the movers were right about what differed and wrong about why.

A cause is named only from an intervention that moved the time: the two sides differ in one
thing the records name (an A/B's commit or software stack, the arm, such as an ablation arm
with one optimization off, or one option of the cell), and the timing says slower or faster
(reports.stats: beyond noise, by at least the minimum effect). Otherwise the line says why
none is claimed: the sides differ in several things, in nothing the records name, or the
time did not move.
"""

from __future__ import annotations

import dataclasses

from reports import stats
from reports.record import Record

DIFFERS = ("Movers are what differs between the two sides' programs (or traced windows): "
           "where to look, not why the time moved; a cause is named only from an "
           "intervention that moved the time.")
"""The sentence above a table of movers."""

SETUP = ("steps", "warmup", "pairing")
"""RunOptions fields that say how a cell was measured (named as a difference)."""


def _spec_changes(a: Record, b: Record) -> list[str]:
    if a.spec is None or b.spec is None:
        return []
    old, new = dataclasses.asdict(a.spec), dataclasses.asdict(b.spec)
    return [f"the option {name} {old[name]} -> {new[name]}" for name in old
            if old[name] != new.get(name)]


def _stack_change(a: Record, b: Record) -> list[str]:
    """The software stack as one change: every package version (and the Python) that
    differs."""
    ea, eb = a.environment, b.environment
    if ea is None or eb is None:
        return []
    found = [f"{pkg} {ea.versions.get(pkg) or 'absent'} -> {eb.versions.get(pkg) or 'absent'}"
             for pkg in sorted(set(ea.versions) | set(eb.versions))
             if ea.versions.get(pkg) != eb.versions.get(pkg)]
    if ea.python != eb.python:
        found.append(f"python {ea.python} -> {eb.python}")
    return [f"the software stack ({', '.join(found)})"] if found else []


def _machine_changes(a: Record, b: Record) -> list[str]:
    """What a comparison does not control: another host, backend or device set, other XLA
    flags or allocator, uncommitted changes on a side."""
    ea, eb = a.environment, b.environment
    if ea is None or eb is None:
        return ["an environment recorded on one side only"] if ea is not eb else []
    found = [f"{name} {getattr(ea, name)} -> {getattr(eb, name)}"
             for name in ("host", "backend", "device_kind", "device_count", "process_count",
                          "xla_flags", "host_malloc") if getattr(ea, name) != getattr(eb, name)]
    found += [f"uncommitted changes on side {side}" for side, env in (("A", ea), ("B", eb))
              if env.git_dirty]
    return found


def interventions(a: Record, b: Record) -> list[str]:
    """Every difference between the setups of two records that could move the time, in
    words, one entry per change: the commit, the software stack (all its versions as one),
    the arm, each option of the cell's spec, how it was measured, and the machine."""
    found = []
    sha_a = a.environment.git_sha if a.environment else None
    sha_b = b.environment.git_sha if b.environment else None
    tree_a = a.environment.git_tree if a.environment else None
    tree_b = b.environment.git_tree if b.environment else None
    if sha_a != sha_b:
        found.append(f"the commit {(sha_a or '?')[:10]} -> {(sha_b or '?')[:10]}")
    elif tree_a and tree_b and tree_a != tree_b:  # one commit, other files on a side
        found.append(f"the files (tree {tree_a[:10]} -> {tree_b[:10]}) on commit "
                     f"{(sha_a or '?')[:10]}")
    found += _stack_change(a, b)
    if a.arm != b.arm:
        found.append(f"the arm {a.arm} -> {b.arm}")
    found += _spec_changes(a, b)
    if a.run and b.run:
        found += [f"{name} {getattr(a.run, name)} -> {getattr(b.run, name)}"
                  for name in SETUP if getattr(a.run, name) != getattr(b.run, name)]
    return found + _machine_changes(a, b)


def cause(timing: stats.Comparison | None, changes: list[str]) -> str:
    """The cause line under an explanation of two sides whose timing is `timing` (None:
    not timed on both) and whose setups differ by `changes` (`interventions`)."""
    if timing is None:
        return ("Cause: none claimed: the sides carry no timing to compare (plans or "
                "captures); an A/B of the change (`parity ab`) can name one.")
    moved = stats.describe(timing)
    if not changes:
        return ("Cause: none claimed: the records name no difference between the sides "
                f"(an A/A, or what differs is outside what they record); the time: {moved}.")
    if len(changes) > 1:
        return (f"Cause: none claimed: the sides differ in {len(changes)} things ("
                + "; ".join(changes) + "); an intervention changes one (`parity ab` of one "
                "commit or stack, one option or ablation arm at a time).")
    if stats.verdict(timing) not in (stats.SLOWER, stats.FASTER):
        return (f"Cause: none claimed: {changes[0]} did not move the time beyond noise by "
                f"the minimum effect ({moved}).")
    return f"**Cause**: {changes[0]} moved the time: {moved}."
