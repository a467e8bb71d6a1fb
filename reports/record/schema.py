"""The sections of a record, each a typed dataclass, and `Record`, which holds them.

A record is one cell (an arm given one spec of work) measured, or planned, in one process: how
it ran, its timings, memory, compiled cost, gradient parity, traced window and environment, or
why it failed. Each section is a keyword-only dataclass of JSON values and further sections.
`Record.to_json` is the record as plain data in the layout of `SCHEMA`; `Record.from_json`
reads data of any schema version (upgraded, then every field checked).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from reports.record.decode import record_section, section
from reports.record.environment import Environment
from reports.record.errors import RecordError
from reports.record.plans import Plan
from reports.record.versions import SCHEMA, upgrade

_section = record_section


@_section
class Spec:
    """The cell's work (arms.spec.CellSpec as data): every arm given it does the same."""

    preset: str
    seq: int
    batch: int
    ga: int
    dtype: str
    mesh: str
    loss: str
    z_loss: float
    optimizer: str
    learning_rate: float
    clip: float | None
    ragged: list[int] | None
    mask_fraction: float
    seed: int
    scan_layers: bool
    remat: str
    loss_agg_mode: str = "token-mean"
    """tunix-grpo's options (absent from other cells' specs, which keep these defaults)."""
    beta: float = 0.0
    epsilon: float = 0.2
    epsilon_high: float | None = None
    epsilon_c: float | None = None
    attention: str = "xla"
    """Our decoder's attention, and its kernel's block sizes (absent where XLA's ran)."""
    attention_block_q: int = 512
    attention_block_kv: int = 1024
    logits_chunk: int = 0
    """Positions per chunk of our decoder's head and loss (0: whole logits; absent at 0)."""
    scan_backward: str = "jax"
    """How our decoder's scanned blocks are differentiated ("jax", absent, or "unfilled")."""

    def without_decoder_options(self) -> tuple:
        """The work without how our decoder computes it (`DECODER_OPTIONS`): equal for two
        cells that differ only in attention or logits chunking (an A/B of those options)."""
        def hashable(value):
            return tuple(value) if isinstance(value, list) else value

        return tuple((f.name, hashable(getattr(self, f.name)))
                     for f in dataclasses.fields(self) if f.name not in DECODER_OPTIONS)


DECODER_OPTIONS = ("attention", "attention_block_q", "attention_block_kv", "logits_chunk",
                   "scan_backward")
"""The Spec fields naming how our decoder computes, not what (arms.spec.DECODER_OPTIONS)."""


@_section
class RunOptions:
    """How the cell was run."""

    steps: int
    warmup: int
    trace: bool
    trace_steps: int
    parity: bool
    trace_hlo: bool = False
    """The traced window was captured with the HLO proto (xprof's memory_viewer and
    graph_viewer work on it)."""
    plan_target: str | None = None
    """A plan record: the TPU topology the cell was compiled for (`parity plan`); it was not
    run, and has a `plan` section instead of timing."""
    plan_slices: int = 1
    """Slices of `plan_target`."""
    capture: bool = False
    """The program had a gradient capture in front of its optimizer (plans of `parity plan
    --capture`, checked runs of schema < 10): keyed apart from records without it."""
    plan_libtpu: str | None = None
    """The libtpu version that planned it: plans of other versions are not compared."""
    pairing: list[str] | None = None
    """Timed in one process with these arms (`--pairing in-process`), in alternating
    slices; None: the cell had its process to itself. Samples of the two ways are not
    pooled or compared (other arms share the caches and allocator)."""


@_section
class StepStats:
    """Statistics of the timed window's per-step wall times (ms)."""

    median_ms: float
    mean_ms: float
    max_ms: float
    min_ms: float
    p90_ms: float
    cv: float
    """Coefficient of variation: stdev / mean."""


@_section
class GCPauses:
    count: int
    total_ms: float


@_section
class Timing:
    """The untraced timed window, and the build before it."""

    steps: int
    warmup: int
    step_ms: list[float]
    """Wall time of every timed step, blocked on its outputs."""
    dispatch_ms: list[float]
    """Of each step: time until the step call returned (host dispatch)."""
    wait_ms: list[float]
    """Of each step: time then blocked until its outputs were ready."""
    stats: StepStats
    gc: GCPauses
    tokens_per_step: int
    tokens_per_s: float
    build_s: float
    compile_s: float
    recompiles_after_warmup: int
    executions_per_step: int
    """Executable calls one optimizer step dispatched (as counted by the arm)."""
    compiles: int | None = None
    """Backend compiles in the cell's process up to the end of the timed window."""
    compile_cache_hits: int | None = None
    """Of `compiles`, those loaded from the persistent compilation cache the cells of the
    run share (harness.store.layout.RunStore: later rounds load every program, another
    shape or arm what they have in common, such as our decoder's initializer): 0 means
    every compile, and so compile_s and build_s, was cold; None in records written before
    the cache existed (cold)."""
    probe_ms: list[float] | None = None
    """A fixed piece of host work (harness.measure.timing.probe_ms) timed 3 times before and 3
    after the window: the machine's speed while the cell ran, which no arm's code changes."""
    steal: float | None = None
    """Share of the CPU time the hypervisor gave other guests during the window (/proc/stat)."""
    other_load: float | None = None
    """Share of the CPU time other processes kept busy during the window (/proc/stat)."""
    slices: list[int] | None = None
    """In-process pairing: the steps of each slice, in the order they ran (`step_ms` is
    their concatenation; slice i of every arm of the process ran next to each other);
    lockstep A/B: slice i of A's and of B's process ran next to each other. None: one
    uninterrupted window."""
    compile_log: list[dict] | None = None
    """Every backend compile of the process in order: {program, seconds, cached, phase}."""

    def sliced(self) -> list[list[float]] | None:
        """`step_ms` cut into its slices; None for one uninterrupted window."""
        if not self.slices:
            return None
        ends = list(itertools.accumulate(self.slices, initial=0))
        return [self.step_ms[a:b] for a, b in itertools.pairwise(ends)]


def sliced_runs(timed: list[Record]) -> list[list[list[float]]] | None:
    """Each timed record's steps cut into its slices (runs x slices x steps); None unless
    every one was timed in slices (in-process pairing, lockstep A/B)."""
    if not timed or not all(r.timing.slices for r in timed):
        return None
    return [r.timing.sliced() for r in timed]


@_section
class ExecutableMemory:
    """XLA's memory_analysis of one executable (bytes, per device)."""

    argument: int
    output: int
    alias: int
    temp: int
    total: int
    """argument + output - alias + temp."""
    generated_code: int | None = None
    """Size of the executable's generated code."""
    held: int | None = None
    """Train state in device memory while it runs without being one of its arguments (the
    optimizer moments during a split fwd/bwd; arms.base.Arm.held_bytes); None in records
    written before it was recorded (schema < 7)."""


@_section
class HostMemory:
    process: int
    rss_delta_bytes: int | None
    peak_bytes_in_use: int | None


@_section
class Memory:
    peak_bytes_in_use: int | None
    """memory_stats()['peak_bytes_in_use'], max over local devices: the process's peak since
    it started; None where missing (`peak_unavailable` says why)."""
    executables: dict[str, ExecutableMemory | None]
    planned_bytes: int | None
    """The planned peak: the maximum, over the executables a step calls, of total + held
    (what is in device memory while the executable runs), as a plan counts it; None where
    no executable has a memory analysis."""
    rss_delta_bytes: int | None
    """Process RSS high-water growth over the timed window."""
    hosts: list[HostMemory] | None = None
    peak_bytes_per_device: list[int | None] | None = None
    """Each local device's memory_stats peak since the cell's process started (each cell is
    its own process); None in records written without it."""
    peak_unavailable: str | None = None
    """Why a device's peak is None (no memory_stats on the backend, or no peak key)."""
    planned_unavailable: str | None = None
    """Why planned_bytes is None (no memory analysis, or an older record's undercount)."""
    heap_reserved_bytes: int | None = None
    """Host heap faulted in and freed again before the timed window, where glibc keeps freed
    memory (CPU cells; harness.measure.memory.reserve_heap). In the resident set, not in
    rss_delta_bytes. None in records written before it existed."""
    device_stats: list[dict[str, int] | None] | None = None
    """Each local device's whole `memory_stats()` after the timed window, as its runtime
    names the figures (a TPU's include `peak_bytes_reserved`: the programs' temporaries,
    reserved outside `peak_bytes_in_use`); None per device where the backend has none, and
    None in records written before it existed."""
    device_stats_after: dict[str, list[dict[str, int] | None]] | None = None
    """The same read when "build" and "warmup" ended (a peak the build reached is its own)."""


@_section
class Cost:
    """What one optimizer step costs: the model's FLOPs by formula, and the compiled
    program's FLOPs and bytes from XLA's cost model made loop-aware. All of these are
    deterministic for a given program, so they are compared exactly (no noise)."""

    model_flops_per_step: float | None
    """Analytic training FLOPs of the step's tokens (MaxText's convention: 6 x matmul
    params x tokens plus causal attention, remat recompute excluded); the same for every arm
    given the same work."""
    model_flops_per_s: float | None
    """model_flops_per_step at the median step time."""
    mfu_vs_bf16_peak: float | None
    """model_flops_per_s / (the device kind's dense bf16 peak x devices); None where the
    peak is not known (CPU)."""
    compiled_flops_per_step: float | None
    """XLA's FLOPs of every executable x its calls per step, each while-loop body counted
    trip-count times; per device (XLA costs each device's SPMD program); None if any
    executable's count is unavailable."""
    bytes_accessed_per_step: float | None
    """XLA's bytes accessed (operands + outputs of every top-level op), weighted, loop-aware
    and per device like compiled_flops_per_step."""
    calls_per_step: dict[str, int]
    """Calls of each executable per optimizer step (the weights of the per-step sums)."""
    compiled_flops_per_executable: dict[str, float | None]
    """Loop-aware FLOPs of one call of each executable."""
    bytes_accessed_per_executable: dict[str, float | None]
    loop_trip_counts: dict[str, list[int]]
    """Known trip counts of each executable's while loops (empty: no loops)."""
    unavailable: dict[str, str] = dataclasses.field(default_factory=dict)
    """Executable -> why its compiled cost is unavailable."""
    categories_per_step: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    """The compiled step by operation category (harness.xla.categories): per category,
    instruction runs, FLOPs, bytes and collective bytes, every executable x its calls per
    step, loops counted as they run (empty where the HLO could not be counted); what
    `parity explain` compares."""


@_section
class Parity:
    """The first step's gradient (a step of its own, after the timed window) vs the exact
    sum/sum reference."""

    data_digest: str
    """sha256 of the step's micro-batches: equal digests, equal data."""
    denominators: list[float]
    denominator: float
    loss: float | None
    """The loss the trainer reported for that step."""
    exact_loss: float
    loss_rel_error: float | None
    grad_l2: float | None
    """||g||; None when not finite (JSON has no NaN: the store writes null)."""
    exact_grad_l2: float
    rel_l2: float | None
    """||g - g_exact|| / ||g_exact||; None when not finite (a NaN or inf gradient)."""
    tied_head: bool | None = None
    """The cell's model ties its output head to the embedding; None in records without the
    field (a MaxText arm's FAIL then names the tied head as a possible cause)."""
    reference_shared: bool = False
    """The exact reference was read back from the reference store (harness.cell.reference)."""
    trainer_denominator: float | None = None
    """What the arm's trainer divided its accumulated gradient by, as it reports or
    configures it (summed denominators; PeftTrainer's accumulation count); None where the
    trainer says nothing (native)."""
    floor_rel_l2: float | None = None
    """Where the arithmetic rounds: ||g_exact - g_exact32|| / ||g_exact32||, the exact
    reference's distance from the same in exact float32; its tolerance is sized by it."""
    reference_s: float | None = None
    """Seconds this cell spent getting its reference (computing or reading it back)."""
    reference_computed_s: float | None = None
    """Seconds computing the reference took (here, or in the cell that stored it)."""
    mean_of_means_rel_l2: float | None = None
    """Ragged work: ||g - g_mom|| / ||g_mom||, g_mom the mean of micro-batch means."""
    predicted_rel_l2: float | None = None
    """Ragged work: ||g_mom - g_exact|| / ||g_exact||, what a mean of means is off by."""
    float32_rel_l2: float | None = None
    """Where the arithmetic rounds: ||g - g_exact32|| / ||g_exact32||, the arm's own distance
    from exact float32 (rel_l2 is its distance from the reference in its own arithmetic,
    which rounds too): which of two arms is nearer the true gradient. None where the work
    is exact float32 (rel_l2 is then this), or the stored reference predates it."""


@_section
class Trace:
    """The separate traced window, parsed from its xplane."""

    xplane: str
    logdir: str
    """The capture's directory, '<trace root>/<run id>/<cell>': the `--logdir` of xprof or
    TensorBoard (reports.viewers.viewer_commands)."""
    executions_per_step: list[int]
    modules_per_step: list[list[str]]
    step_ms: list[float]
    busy_ms: list[float]
    """Per traced step: the union of its executions' op intervals, each op until it
    completed (harness.measure.trace.parse_steps)."""
    host_ms: list[float]
    """Per traced step: step_ms - busy_ms, the time no op of the step was running."""


UNAVAILABLE = "unavailable"
"""The failure reason of a cell not run because its arm cannot run in the environment (a
package missing, or an import that fails: arms.requirements); it was asked for by a suite or
the default arms, and is listed as not run here rather than as failed."""


@_section
class Failure:
    reason: str
    """exception, crash, timeout, killed, oom, peer-died, does-not-fit (refused by its fit
    check before anything was built), unavailable (not run: `UNAVAILABLE`)."""
    message: str
    traceback: str | None = None
    stderr_tail: str | None = None


@_section
class ABTag:
    """Which side of an A/B run a record belongs to."""

    side: str
    """"A" or "B"."""
    sha: str


@_section
class Record:
    """One cell's result: one JSON line in a results file."""

    schema: int = SCHEMA
    status: str = "ok"
    """"ok" or "failed" (then `error` says why and the measured sections are None)."""
    error: Failure | None = None
    run_id: str | None = None
    suite: str | None = None
    arm: str | None = None
    about: str | None = None
    """The arm in words: '<trainer> on <model>'."""
    spec: Spec | None = None
    config_hash: str | None = None
    run: RunOptions | None = None
    timestamp: str | None = None
    wall_s: float | None = None
    """The cell process's wall time, start to exit."""
    environment: Environment | None = None
    timing: Timing | None = None
    cost: Cost | None = None
    memory: Memory | None = None
    parity: Parity | None = None
    parity_not_checked: str | None = None
    """Why a gradient check that was asked for gave no verdict ('oom: ...', 'timeout: ...',
    'exception: ...'): the check runs after every measurement, so the record keeps them;
    None where the check ended (`parity`) or was not asked for."""
    trace: Trace | None = None
    round: int = 0
    """Index of this process among the cell's interleaved rounds in its run."""
    ab: ABTag | None = None
    plan: Plan | None = None
    """A plan record's plan (run.plan_target says for which target); in a run record on an
    accelerator, the plan of its step for the device it ran on (its fit check), which is
    also the plan of a cell refused as `does-not-fit`."""
    phases: dict[str, float] | None = None
    """Wall seconds of each phase of the cell's process, in order (harness.cell.phases.Phases):
    start (interpreter start-up, or the fork from a zygote), imports, backend, build,
    compile, warmup, memory, timed, cost, trace, reference (the exact gradient), record;
    on the first cell a zygote forked, `preload` first: the seconds the zygote spent
    importing its arm's packages (harness.cell.zygote). None in records written without it."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unavailable(self) -> bool:
        """Not run, its arm unavailable in the environment (`UNAVAILABLE`): neither ok nor
        a failure of the run."""
        return self.error is not None and self.error.reason == UNAVAILABLE

    @property
    def is_plan(self) -> bool:
        """A plan record (`parity plan`): compiled for a target, not run. A run record may
        hold a plan too: its step planned for the device it ran on (the fit check)."""
        return bool(self.run and self.run.plan_target)

    def cell_key(self, versions: bool = True, options: bool = True) -> tuple:
        """Records with equal keys measured the same work the same way in comparable
        environments (`versions=False`: whatever their package versions, for a stack A/B;
        `options=False`: whatever our decoder's options, for an A/B of those)."""
        plan, run = self.is_plan, self.run
        env = self.environment.comparable_key(plan, versions) if self.environment else None
        if run:  # a plan: its target, not how it would be run
            run = (*(("plan", run.plan_target, run.plan_slices, run.plan_libtpu) if plan else
                     (run.steps, run.warmup, *((tuple(run.pairing),) if run.pairing else ()))),
                   *(("capture",) if run.capture else ()))
        work = self.config_hash if options or self.spec is None else (
            self.spec.without_decoder_options())
        return (self.arm, work, run, env)

    def to_json(self) -> dict[str, Any]:
        """The record as plain JSON data (the layout of schema `SCHEMA`)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any, where: str = "record", *, whole: bool = True) -> Record:
        """A validated record from JSON data of any schema version; `where` (e.g.
        'results.jsonl:3') prefixes every error. `whole`: a stored record, also `check`ed
        (a worker's own part, before the runner adds how it ran, is not)."""
        if not isinstance(data, dict):
            raise RecordError(f"{where}: not a parity record (a JSON object is expected)")
        record = section(cls, upgrade(data, where), where)
        if whole:
            record.check(where)
        return record

    def check(self, where: str = "record") -> None:
        """Raises RecordError for a record no writer produces: an unknown status, a failure
        without its reason, a result without its measurements (timing, or a plan's plan),
        a timed window with no steps or a step time that is not a finite number."""
        if self.status not in ("ok", "failed"):
            raise RecordError(f"{where}: field 'status': {self.status!r} is neither 'ok' nor "
                              "'failed'")
        if self.status == "failed":
            if self.error is None:
                raise RecordError(f"{where}: field 'error': a failed record says why it failed")
            return
        if self.run is not None and self.run.plan_target:
            if self.plan is None:
                raise RecordError(f"{where}: field 'plan': an ok plan record (run.plan_target "
                                  f"{self.run.plan_target}) holds its plan")
            return
        if self.timing is None:
            raise RecordError(f"{where}: field 'timing': an ok record holds its timing")
        if not self.timing.step_ms:
            raise RecordError(f"{where}: field 'timing.step_ms': an ok record has at least "
                              "one timed step")
        bad = [i for i, ms in enumerate(self.timing.step_ms) if not math.isfinite(ms)]
        if bad:
            raise RecordError(f"{where}: field 'timing.step_ms[{bad[0]}]': "
                              f"{self.timing.step_ms[bad[0]]} is not a finite time")

