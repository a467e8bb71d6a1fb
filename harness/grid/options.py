"""A grid's options: a command's defaults, then a suite, then the values given explicitly,
each overriding the one before; and every check of an option's value that needs no device,
each made in one place whichever command takes the option."""

from __future__ import annotations

from typing import Any

from harness.contract import IN_PROCESS, LOCKSTEP, PROCESSES
from harness.grid import suites
from harness.grid.expand import RUN_KEYS, SPEC_KEYS
from reports import sequential, stats

SUITE_ONLY_KEYS = ("description", "arms", "timeout_s", "ragged", "regression_threshold",
                   "cpu_devices", "rounds", "target", "target_slices", "micro_batch",
                   "decoder")
"""Keys a suite may set beside the spec's and the run's."""

MULTI_PROCESS_MESH = "fsdp=-1"
"""The mesh of a multi-process run given none: FSDP over every process's devices (one
device, the single-process default, cannot hold a batch that several processes feed)."""

_AT_LEAST_ONE = {"steps": "--steps", "warmup": "--warmup", "trace_steps": "--trace-steps",
                 "rounds": "--rounds", "cpu_devices": "--cpu-devices"}
_WHY = {"warmup": " (a first step is never timed: it allocates what the steps after it reuse)",
        "cpu_devices": " (it emulates that many CPU devices)"}


def load_suite(name: str) -> dict[str, Any]:
    """A named suite (harness.grid.suites), its keys checked."""
    suite = suites.read(name)
    unknown = set(suite) - {"name"} - set(SPEC_KEYS) - set(RUN_KEYS) - set(SUITE_ONLY_KEYS)
    if unknown:
        raise ValueError(f"suite {name!r} has unknown keys {sorted(unknown)}")
    return suite


def merge(explicit: dict[str, Any], *, suite: str | None = None,
          defaults: dict[str, Any] | None = None) -> dict[str, Any]:
    """The grid's options: `defaults`, then `suite`'s, then the `explicit` values that are
    not None. Asking for the HLO proto (`trace_hlo`) is asking for a trace, unless `trace`
    is given; the arms default to arms.registry.DEFAULT_ARMS."""
    from arms.registry import DEFAULT_ARMS

    options = dict(defaults or {})
    options.update(load_suite(suite) if suite else {})
    for given, other in (("batch", "micro_batch"), ("micro_batch", "batch")):
        if explicit.get(given) is not None:  # the one given replaces the suite's other
            options.pop(other, None)
    options.update({k: v for k, v in explicit.items() if v is not None})
    if explicit.get("trace") is None and (explicit.get("trace_hlo") or (
            options.get("trace_hlo") and "trace" not in options)):
        options["trace"] = True
    options.setdefault("arms", list(DEFAULT_ARMS))
    return options


def check(options: dict[str, Any]) -> None:
    """Raises one ValueError for a run option out of its range (the cells check the rest)."""
    for key, flag in _AT_LEAST_ONE.items():
        value = options.get(key)
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: give at least 1{_WHY.get(key, '')}")
    fit = options.get("fit_bytes")
    if fit is not None and not fit > 0:
        raise ValueError(f"--fit-gib {fit / 2**30:g}: give the GiB one device may use (> 0)")
    timeout = options.get("timeout_s")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"--timeout {timeout}: give the seconds a cell may run (> 0)")
    wait = options.get("wait_s")
    if wait is not None and not wait >= 0:
        raise ValueError(f"--wait-for-device {wait}: give the seconds to wait (>= 0)")


def check_jobs(jobs: int | None) -> None:
    """--jobs: cells planned side by side."""
    if jobs is not None and jobs < 1:
        raise ValueError(f"--jobs {jobs}: give at least 1 cell at a time")


def check_slices(slices: int, steps: int) -> None:
    """--slices of a pairing that times steps in alternating slices (in-process, lockstep):
    2 or more, dividing the timed steps."""
    if slices < 2 or steps % slices:
        raise ValueError(f"--slices {slices} with --steps {steps}: give 2 or more slices that "
                         "divide the timed steps (e.g. --steps 10 --slices 5), or pass "
                         "--pairing processes")


def check_pairable(arms: list[str], steps: int, slices: int) -> None:
    """Raises ValueError (one line naming the fix) for arms or slicing that cannot pair in
    one process."""
    from arms.registry import cannot_share_a_process

    refused = [f"{arm}: {why}" for arm in arms if (why := cannot_share_a_process(arm))]
    if refused:
        raise ValueError(
            f"--pairing {IN_PROCESS} cannot put these arms in one process: "
            + "; ".join(refused) + ". Pair only engine, engine-fused and native (and plugin "
            "arms built on them), or use --pairing processes")
    if len(arms) < 2:
        raise ValueError(f"--pairing {IN_PROCESS} needs at least two arms to "
                         f"pair, got {', '.join(arms) or 'none'}")
    check_slices(slices, steps)


LOCKSTEP_MIN_ROUNDS = 2
"""Fewest rounds of a lockstep A/B, whatever its slice pairs: one round is one process a
side, whose luck (where it landed in memory, which core) a round more samples."""


def check_ab_rounds(rounds: int, pairing: str, slices: int) -> None:
    """--rounds of `parity ab`: enough pairs for a verdict to reach 95% (reports.stats):
    MIN_PAIRS interleaved rounds where A's and B's processes run one after the other; in
    lockstep, where slice pairs are the unit, at least LOCKSTEP_MIN_ROUNDS rounds (the luck
    of a process is sampled) of MIN_PAIRS slice pairs in all."""
    if pairing == PROCESSES and rounds < stats.MIN_PAIRS:
        raise ValueError(f"--rounds {rounds}: A/B needs at least {stats.MIN_PAIRS} rounds "
                         "(fewer interleaved pairs cannot reach 95% confidence)")
    if pairing == LOCKSTEP and (rounds < LOCKSTEP_MIN_ROUNDS
                                or rounds * slices < stats.MIN_PAIRS):
        raise ValueError(f"--rounds {rounds} with --slices {slices}: lockstep A/B needs at "
                         f"least {LOCKSTEP_MIN_ROUNDS} rounds and {stats.MIN_PAIRS} slice "
                         "pairs in all (fewer cannot reach 95% confidence)")


def first_look(pairing: str, slices: int) -> int:
    """The fewest rounds whose look may stop an A/B before its budget: where its runs
    could reach 95% at all (reports.sequential.first_round: 4 + 4 independent runs where
    A's and B's processes run one after the other; MIN_PAIRS slice pairs in lockstep), and
    in lockstep at least LOCKSTEP_MIN_ROUNDS."""
    if pairing == LOCKSTEP:
        return max(LOCKSTEP_MIN_ROUNDS, sequential.first_round(slices))
    return sequential.first_round()
