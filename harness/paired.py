"""In-process pairing: the arms of one shape built in one process and timed in alternating
slices (A B C, B C A, C A B, ...), so that what moves a whole process (its memory layout, the
machine's state while it runs) moves every arm of it alike.

Whole processes of identical code run 6-15% apart on a 2-core VM, against 1-3% inside one
process; interleaving arms inside one process pairs their slices, and the ratio of two arms
is read from those pairs (`reports.stats.compare_slices`). The grid is repeated over a few
processes (`rounds`), so the luck of one process is sampled too.

Only arms that leave no process-wide state behind can share a process
(`arms.registry.cannot_share_a_process`); the others are refused before anything runs.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import results
from harness.lockstep import Gate
from harness.reaper import REAPER, raise_if_signalled
from harness.worker import (
    CellRun,
    Phases,
    _block,
    _build,
    _cost,
    _memory,
    _parity,
    _planned_memory,
    _warmup,
    start_backend,
    timing_record,
)
from reports.record import Record

IN_PROCESS = "in-process"
"""`--pairing` of this module (the other, "processes", gives every cell processes of its own)."""


def refusals(arms: Sequence[str]) -> list[str]:
    """'<arm>: <why>' for every arm that cannot share a process with the others."""
    from arms.registry import cannot_share_a_process

    return [f"{arm}: {why}" for arm in arms if (why := cannot_share_a_process(arm))]


def check(arms: Sequence[str], steps: int, slices: int) -> None:
    """Raises ValueError (one line naming the fix) for arms or slicing that cannot pair."""
    refused = refusals(arms)
    if refused:
        raise ValueError(
            f"--pairing {IN_PROCESS} cannot put these arms in one process: "
            + "; ".join(refused) + ". Pair only engine, engine-fused and native (and plugin "
            "arms built on them), or use --pairing processes")
    if len(arms) < 2:
        raise ValueError(f"--pairing {IN_PROCESS} needs at least two arms to pair, got "
                         f"{', '.join(arms) or 'none'}")
    if slices < 2 or steps % slices:
        raise ValueError(f"--slices {slices} with --steps {steps}: give 2 or more slices "
                         "that divide the timed steps (e.g. --steps 40 --slices 8)")


def run_paired(runs: Sequence[CellRun], slices: int, phases: Phases,
               gate: Gate | None = None) -> list[Record]:
    """Builds every arm of `runs` (one shape) here, warms each (its first step checks
    parity), then times `slices` slices of steps/slices steps each, the arm order rotated
    from slice to slice (`slice_order`); one record per arm. With a `gate` (lockstep A/B,
    harness.lockstep), the process says when it is ready and times each slice only when
    told to, as another process's slices alternate with its own."""
    import importlib

    from arms.registry import preload
    from arms.spec import CellSpec
    from harness import measure

    for module in dict.fromkeys(m for run in runs for m in run.plugins):
        importlib.import_module(module)
    spec = CellSpec.from_dict(runs[0].spec)
    for run in runs:
        preload(run.arm)
    phases.end("imports")
    compiles = start_backend(phases)
    built = []
    for run in runs:
        arm, build_s = _build(run.arm, spec)
        batches = arm.place(spec.micro_batches(0))
        first_loss, captured = _warmup(arm, batches, run)
        built.append((run, arm, batches, build_s, first_loss, captured))
    phases.end("build")
    per_slice = runs[0].steps // slices
    samples = [([], [], []) for _ in built]
    pauses = [measure.GCPauses() for _ in built]
    recompiles = [0] * len(built)
    measure.settle_heap()
    if gate is not None:
        gate.ready()
    noise = _time_slices(built, slices, per_slice, samples, pauses, recompiles, compiles,
                         gate)
    if gate is not None:
        gate.released()
    phases.end("timed")
    records = []
    for k, (run, arm, _, build_s, first_loss, captured) in enumerate(built):
        timing = timing_record(arm, run, spec, samples[k], pauses[k], recompiles[k],
                               compiles, build_s, noise, slices=[per_slice] * slices)
        executables = arm.executables()
        planned = _planned_memory(executables)
        records.append(Record(
            about=arm.about(), timing=timing, memory=_memory(planned, None, 0),
            cost=_cost(executables, arm.calls_per_step(), timing.stats.median_ms, spec),
            parity=_parity(spec, captured, first_loss) if run.parity else None))
    phases.end("cost")
    for _, arm, *_ in built:
        arm.close()
    return records


def slice_order(arms: int, index: int) -> list[int]:
    """The arms' order in slice `index`: rotated by one each slice (A B C, B C A, C A B).
    Every arm takes every place equally often, and no arm runs twice in a row across
    slices with 3+ arms (with 2, each repeats equally: A B, B A). Reversing instead (A B C,
    C B A) would let the outer arms run twice in a row, warm, and never the middle one:
    measured, a middle copy of `native` ran 4% apart from the same code outside it."""
    return [(index + j) % arms for j in range(arms)]


def _time_slices(built, slices: int, per_slice: int, samples, pauses, recompiles,
                 compiles, gate: Gate | None) -> dict:
    """The timed slices, each an arm's steps/slices steps, in `slice_order`, and with a
    `gate`, each slice begun when it says. Returns the machine's readings over the slices
    (`measure.NoiseMeter`), its probes taken in this process's own turns: the first after
    the first go, the last before the gate hears of the last slice."""
    from harness import measure

    meter = None
    for index in range(slices):
        if gate is not None:
            gate.wait()
        meter = meter or measure.NoiseMeter()
        with meter.window():
            for k in slice_order(len(built), index):
                _, arm, batches, *_ = built[k]
                before = compiles.count
                with pauses[k].watch():
                    wall, dispatch, wait = measure.timed_steps(
                        lambda a=arm, b=batches: a.step(b), per_slice, _block)
                recompiles[k] += compiles.count - before
                for kept, new in zip(samples[k], (wall, dispatch, wait), strict=True):
                    kept += new
        noise = meter.close() if index == slices - 1 else None
        if gate is not None:
            gate.done()
    return noise


def groups(cells: Sequence[CellRun]) -> list[list[CellRun]]:
    """The cells grouped by shape (their spec), each group's arms in the order given."""
    found: dict[str, list[CellRun]] = {}
    for cell in cells:
        found.setdefault(json.dumps(cell.spec, sort_keys=True), []).append(cell)
    return list(found.values())


def run_one_process(group: Sequence[CellRun], slices: int, env: dict[str, str],
                    timeout_s: float, cwd: Path | None = None) -> list[Record]:
    """One paired process of `group`; a record per arm whatever happens to it (a failed
    process fails every arm of it, with the same reason)."""
    from harness.runner import Exit, cell_json, classify, worker_process

    with tempfile.TemporaryDirectory(prefix="parity-paired-") as tmp, \
            REAPER.watch("path", path=tmp):
        out, err_path = Path(tmp) / "records.json", Path(tmp) / "stderr.txt"
        start = time.perf_counter()
        timeout_s *= len(group)  # every arm of the process builds and times
        code, max_rss = worker_process(
            ["--cell", json.dumps([json.loads(cell_json(c)) for c in group]),
             "--slices", str(slices), "--out", str(out)], env, err_path, timeout_s, cwd)
        stderr = err_path.read_text(errors="replace") if err_path.exists() else ""
        failure = classify(Exit(code=code, stderr=stderr, wrote_record=out.exists(),
                                max_rss_bytes=max_rss, oom_kills=0), timeout_s)
        if failure is not None:
            records = [dataclasses.replace(failure) for _ in group]
        else:
            records = [Record.from_json(data, f"paired cell {cell.arm}", whole=False)
                       for cell, data in zip(group, json.loads(out.read_text()), strict=True)]
        elapsed = time.perf_counter() - start
    for record in records:
        record.wall_s = elapsed
    return records


def run_paired_grid(cells: Sequence[CellRun], out_dir: str | Path, *, env: dict[str, str],
                    timeout_s: float, slices: int, rounds: int = 1, run_id: str | None = None,
                    suite: str | None = None, environment: dict | None = None,
                    on_record: Callable[[int, Record], None] | None = None,
                    on_start: Callable[[CellRun, int], None] | None = None,
                    cwd: Path | None = None) -> tuple[Path, list[Record]]:
    """Every shape's arms paired in one process, `rounds` processes per shape (shapes in
    reversed order on odd rounds); records appended to `out_dir/<run_id>.jsonl` as each
    process ends. A run resumed with the same `run_id` skips the processes it recorded.
    Traces are not taken here (a traced window is a run of its own)."""
    from harness.runner import (
        _config_hash,
        _path_safe,
        _store,
        new_run_id,
        recorded,
        results_path,
        stamp,
    )
    from harness.worker import COMPILE_CACHE, REFERENCE_DIR

    run_id = run_id or new_run_id()
    path = results_path(out_dir, run_id, suite)
    done = recorded(path, run_id)  # a resumed run: its processes that ended are not rerun
    shapes = groups([dataclasses.replace(c, trace=False) for c in cells])
    index_of = {(c.arm, json.dumps(c.spec, sort_keys=True)): n for n, c in enumerate(cells)}
    records: list[Record] = []
    with results.exclusive(path), _store(None) as store:
        for round_index in range(rounds):
            order = shapes if round_index % 2 == 0 else shapes[::-1]
            for group in order:
                raise_if_signalled()
                if all((c.arm, _config_hash(c), round_index) in done for c in group):
                    continue
                if round_index:
                    group = [dataclasses.replace(c, parity=False) for c in group]
                arms = [c.arm for c in group]
                for cell in group:
                    if on_start:
                        on_start(cell, round_index)
                # Shared with the shape's later processes: the compiled programs (a
                # cache per set of arms) and the exact reference (one per shape).
                shared = {COMPILE_CACHE: str(store / "compile" / _path_safe("+".join(arms))),
                          REFERENCE_DIR: str(store / "reference")}
                found = run_one_process(group, slices, {**env, **shared}, timeout_s, cwd)
                for cell, record in zip(group, found, strict=True):
                    stamp(record, cell, run_id=run_id, suite=suite, round_index=round_index,
                          env=env, environment=environment)
                    record.run.pairing = arms
                    results.append(path, record)
                    records.append(record)
                    if on_record:
                        on_record(index_of[cell.arm, json.dumps(cell.spec, sort_keys=True)],
                                  record)
    return path, records
