"""A synthetic nightly history of real `Record`s, shaped like `parity nightly --suite
tpu7x-nightly --plan` run once a night for months: every cell of the suite, its rounds,
steps and warmup, a plan record per cell and night, and planted events of known size
(a regression and its fix, an improvement, a cost jump, a failed night, environment
changes). Built in memory from the record's own classes (no fake of a project class);
`write` stores it the way the harness appends records (one JSON line each).

Step times imitate an accelerator host, quieter than a CPU runner: per-process log offset
SD `RUN_SD`, per-step SD `STEP_SD`, plus a rare slow step.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
from pathlib import Path

import numpy as np

from harness.measure.roofline import roofline
from reports.record import (
    Cost,
    Environment,
    ExecutableMemory,
    ExecutablePlan,
    Failure,
    GCPauses,
    Memory,
    Plan,
    Record,
    RunOptions,
    Spec,
    StepStats,
    Timing,
    Trace,
)

ARMS = ("engine", "engine-fused", "native", "peft-decoder", "peft-maxtext", "maxtext-engine")
"""tpu7x-nightly's arms (harness/suites/tpu7x-nightly.toml)."""
PRESETS = ("qwen3-1.7b", "qwen3-8b")
GAS = (1, 4)
ROUNDS, STEPS, WARMUP = 4, 30, 5
START = datetime.datetime(2026, 1, 1, 2, 0, tzinfo=datetime.UTC)
RUN_SD, STEP_SD = 0.006, 0.01

SPEED = {"native": 1.0, "engine-fused": 1.01, "engine": 1.04, "maxtext-engine": 1.08,
         "peft-decoder": 1.15, "peft-maxtext": 1.2}
"""Each arm's step time relative to native's."""
BASE_MS = {"qwen3-1.7b": 410.0, "qwen3-8b": 1650.0}
"""native's ms/step at GA 1 (batch 32 x seq 4096 on a TPU7x slice; GA 4 is ~3.9x)."""
VERSIONS = {"jax": "0.11.2", "jaxlib": "0.11.2", "flax": "0.12.12", "optax": "0.2.8",
            "orbax-checkpoint": "0.12.8", "google-tunix": "0.1.7", "maxtext": "0.2.5",
            "libtpu": "0.0.31"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Event:
    """Something planted from night `start` (inclusive) to `end` (exclusive; None: for
    good) on the cells it matches."""

    start: int
    end: int | None = None
    arm: str | None = None
    """The cell's arm (None: every arm)."""
    preset: str | None = None
    ga: int | None = None
    scale: float = 1.0
    """Factor on the step time."""
    bytes_scale: float = 1.0
    """Factor on XLA's bytes accessed per step."""
    peak_add: int = 0
    """Bytes added to the plan's planned peak."""
    fail: str | None = None
    """Every round of the night fails with this reason."""
    versions: dict[str, str] | None = None
    """Versions from this night on (the environment changes: not comparable across it)."""
    xla_flags: str | None = None

    def hits(self, night: int, arm: str, preset: str, ga: int) -> bool:
        return (self.start <= night and (self.end is None or night < self.end)
                and self.arm in (None, arm) and self.preset in (None, preset)
                and self.ga in (None, ga))


def events(nights: int) -> list[Event]:
    """The planted events, placed at fractions of `nights` (so short histories have them)."""
    at = lambda fraction: max(1, int(nights * fraction))
    return [
        # A 12% slowdown of engine on qwen3-8b GA 4 with an extra pass of bytes, fixed later.
        Event(start=at(0.25), end=at(0.30), arm="engine", preset="qwen3-8b", ga=4,
              scale=1.12, bytes_scale=1.08),
        # native on qwen3-1.7b GA 1 gets 10% faster for good.
        Event(start=at(0.40), arm="native", preset="qwen3-1.7b", ga=1, scale=0.9),
        # One night peft-maxtext on qwen3-8b GA 4 runs out of memory.
        Event(start=at(0.45), end=at(0.45) + 1, arm="peft-maxtext", preset="qwen3-8b", ga=4,
              fail="oom"),
        # libtpu upgrade, then jax: everything 3% faster after the jax one.
        Event(start=at(0.35), versions={"libtpu": "0.0.32"}),
        Event(start=at(0.55), versions={"libtpu": "0.0.32", "jax": "0.12.0",
                                        "jaxlib": "0.12.0"}, scale=0.97),
        # engine-fused's planned peak jumps by 1 GiB on qwen3-8b GA 1.
        Event(start=at(0.70), arm="engine-fused", preset="qwen3-8b", ga=1, peak_add=2**30),
        # An XLA flag is added to every cell.
        Event(start=at(0.85), xla_flags="--xla_tpu_enable_latency_hiding_scheduler=true"),
    ]


def _spec(preset: str, ga: int) -> Spec:
    return Spec(preset=preset, seq=4096, batch=32, ga=ga, dtype="bfloat16", mesh="fsdp=-1",
                loss="xent", z_loss=0.0, optimizer="adamw", learning_rate=1e-3, clip=1.0,
                ragged=None, mask_fraction=1.0, seed=0, scan_layers=True, remat="full")


def _config_hash(arm: str, spec: Spec, plan: bool) -> str:
    text = json.dumps([arm, dataclasses.asdict(spec), plan], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _environment(night: int, planted: list[Event]) -> Environment:
    versions, flags = dict(VERSIONS), ""
    for event in planted:
        if event.start <= night:
            versions.update(event.versions or {})
            flags = event.xla_flags if event.xla_flags is not None else flags
    sha = hashlib.sha1(f"night {night}".encode()).hexdigest()
    return Environment(git_sha=sha, git_dirty=False, versions=versions, python="3.12.1",
                       backend="tpu", device_kind="TPU7x", device_count=8,
                       local_device_count=8, process_count=1, xla_flags=flags,
                       host="t7x-nightly-0")


def _active(planted, night, arm, preset, ga) -> list[Event]:
    return [e for e in planted if e.hits(night, arm, preset, ga)]


def _timing(rng, median_ms: float, tokens: int, executions: int, count: int) -> Timing:
    offset = np.exp(rng.normal(0, RUN_SD))
    steps = median_ms * offset * (1 + rng.normal(0, STEP_SD, count))
    steps[rng.random(count) < 0.02] *= 1.3  # a rare slow step (a host hiccup)
    step_ms = [round(float(x), 4) for x in steps]
    ordered = sorted(step_ms)
    mean = float(np.mean(step_ms))
    stats = StepStats(median_ms=float(np.median(step_ms)), mean_ms=mean, max_ms=ordered[-1],
                      min_ms=ordered[0], p90_ms=float(np.percentile(step_ms, 90)),
                      cv=float(np.std(step_ms, ddof=1) / mean))
    dispatch = [round(0.02 * x, 4) for x in step_ms]
    return Timing(steps=count, warmup=WARMUP, step_ms=step_ms, dispatch_ms=dispatch,
                  wait_ms=[round(a - b, 4) for a, b in zip(step_ms, dispatch, strict=True)],
                  stats=stats, gc=GCPauses(count=0, total_ms=0.0), tokens_per_step=tokens,
                  tokens_per_s=tokens / (stats.median_ms / 1e3), build_s=40.0, compile_s=95.0,
                  recompiles_after_warmup=0, executions_per_step=executions, compiles=3,
                  compile_cache_hits=0,
                  probe_ms=[round(float(x), 3) for x in 9.0 + rng.random(6)],
                  steal=0.0, other_load=round(float(rng.random() * 0.02), 4))


def _cost(arm: str, preset: str, ga: int, bytes_scale: float) -> tuple[Cost, Memory, int]:
    params = 1.7e9 if preset == "qwen3-1.7b" else 8.2e9
    model = 6 * params * 32 * 4096 / 8
    split = arm in ("engine", "peft-decoder", "peft-maxtext", "maxtext-engine")
    names = ("fwd_bwd", "update") if split else ("train_step",)
    executions = (ga + 1) if split and ga > 1 else len(names)
    calls = {"fwd_bwd": ga, "update": 1} if split else {"train_step": 1}
    flops = {n: model * (1.33 if n != "update" else 0.001) / (ga if n == "fwd_bwd" else 1)
             for n in names}
    bytes_ = {n: params * 2.5 * bytes_scale * (1.1 if arm.startswith("peft") else 1.0)
              / (ga if n == "fwd_bwd" else 1) for n in names}
    cost = Cost(model_flops_per_step=model, model_flops_per_s=None, mfu_vs_bf16_peak=None,
                compiled_flops_per_step=sum(flops[n] * calls[n] for n in names),
                bytes_accessed_per_step=sum(bytes_[n] * calls[n] for n in names),
                calls_per_step=calls, compiled_flops_per_executable=flops,
                bytes_accessed_per_executable=bytes_, loop_trip_counts={n: [28] for n in names})
    # The step by category: the matmuls' bytes as without the planted pass, the loop
    # fusions the rest (a planted pass of bytes moves them).
    total = cost.bytes_accessed_per_step
    cost.categories_per_step = {
        "matmul": {"count": 96.0, "flops": cost.compiled_flops_per_step,
                   "hbm_bytes": 0.4 * total / bytes_scale, "collective_bytes": 0.0},
        "fusion: loop": {"count": 300.0 if bytes_scale == 1.0 else 301.0, "flops": 0.0,
                         "hbm_bytes": total - 0.4 * total / bytes_scale,
                         "collective_bytes": 0.0}}
    state = int(params * 12 / 8)
    executables = {n: ExecutableMemory(argument=state, output=state, alias=state,
                                       temp=int(params / 2), total=state + int(params / 2),
                                       held=0)
                   for n in names}
    memory = Memory(peak_bytes_in_use=int(state * 1.4), executables=executables,
                    planned_bytes=max(m.total + m.held for m in executables.values()),
                    rss_delta_bytes=2**20, peak_bytes_per_device=[int(state * 1.4)] * 8)
    return cost, memory, executions


def _plan(arm: str, preset: str, ga: int, peak_add: int, libtpu: str) -> Plan:
    params = 1.7e9 if preset == "qwen3-1.7b" else 8.2e9
    state = int(params * 12 / 8)
    peak = state + int(params * ga * 0.4) + peak_add
    executable = ExecutablePlan(calls_per_step=1, argument=state, output=state, alias=state,
                                temp=peak - state, peak_memory_in_bytes=peak, host_temp=0,
                                held_bytes=0, hbm_bytes=params * 3.0, flops=params * 6e3,
                                collective_bytes={"all-gather": params / 4,
                                                  "reduce-scatter": params / 4},
                                trip_counts=[28])
    plan = Plan(target="tpu7x:2x2x1", slices=1, device_kind="TPU7x", device_count=8,
                libtpu=libtpu, mesh={"fsdp": 8}, hbm_capacity_bytes=int(94.74 * 2**30),
                executables={"train_step": executable},
                resident_bytes={"params": int(params * 4 / 8), "opt_state": int(params * 8 / 8)},
                planned_peak_bytes=peak, peak_executable="train_step", xla_peak_bytes=peak,
                hbm_bytes_per_step=params * 3.0 * ga, flops_per_step=params * 6e3 * ga,
                model_flops_per_step=6 * params * 32 * 4096,
                collective_bytes_per_step={"all-gather": params / 4 * ga,
                                           "reduce-scatter": params / 4},
                fits=peak <= int(94.74 * 2**30), compile_s=0.0, host_peak_rss_bytes=2**33)
    plan.roofline = roofline(plan, "bfloat16")
    return plan


def _run_id(when: datetime.datetime, pid: int) -> str:
    return f"{when.strftime('%Y%m%dT%H%M%S%fZ')}-p{pid}"


def nightly_history(*, nights: int = 365, arms=ARMS, presets=PRESETS, gas=GAS,
                    plans: bool = True, seed: int = 0, steps: int = STEPS,
                    planted: list[Event] | None = None) -> list[Record]:
    """`nights` nights of the suite (every arm x preset x GA, `ROUNDS` rounds of `steps`
    steps interleaved, then a plan per cell when `plans`), oldest first."""
    rng = np.random.default_rng(seed)
    planted = events(nights) if planted is None else planted
    cells = [(a, p, g) for p in presets for g in gas for a in arms]
    records = []
    for night in range(nights):
        start = START + datetime.timedelta(days=night)
        run_id = _run_id(start, 4000 + night)
        env = _environment(night, planted)
        clock = start
        for round_index in range(ROUNDS):
            order = cells if round_index % 2 == 0 else cells[::-1]
            for arm, preset, ga in order:
                active = _active(planted, night, arm, preset, ga)
                spec = _spec(preset, ga)
                clock += datetime.timedelta(seconds=150)
                record = Record(
                    run_id=run_id, suite="tpu7x-nightly", arm=arm, about=f"{arm} on a model",
                    spec=spec, config_hash=_config_hash(arm, spec, False),
                    run=RunOptions(steps=steps, warmup=WARMUP, trace=False, trace_steps=0,
                                   parity=round_index == 0),
                    timestamp=clock.isoformat(), wall_s=150.0, environment=env,
                    round=round_index)
                fail = next((e.fail for e in active if e.fail), None)
                if fail:
                    record.status = "failed"
                    record.error = Failure(reason=fail, message="RESOURCE_EXHAUSTED: out of "
                                           "memory while allocating 3.1 GiB")
                    records.append(record)
                    continue
                scale = float(np.prod([e.scale for e in active]))
                bytes_scale = float(np.prod([e.bytes_scale for e in active]))
                median = BASE_MS[preset] * SPEED[arm] * (1 if ga == 1 else 3.9) * scale
                cost, memory, executions = _cost(arm, preset, ga, bytes_scale)
                record.timing = _timing(rng, median, 32 * 4096, executions, steps)
                record.cost, record.memory = cost, memory
                if round_index == 0 and night == nights - 1:
                    logdir = f"/data/parity-history/traces/{run_id}/{arm}-{preset}-ga{ga}"
                    record.trace = Trace(xplane=f"{logdir}/plugins/profile/x/h.xplane.pb",
                                         logdir=logdir, executions_per_step=[executions],
                                         modules_per_step=[["jit_train_step"]],
                                         step_ms=[median], busy_ms=[median * 0.95],
                                         host_ms=[median * 0.05])
                records.append(record)
        if plans:
            plan_id = _run_id(clock + datetime.timedelta(seconds=5), 5000 + night)
            # plans compile under their own allocator (harness.system.allocator.compile_env)
            plan_env = dataclasses.replace(env, host_malloc=(
                "LD_PRELOAD=libmimalloc.so.3 MIMALLOC_ARENA_EAGER_COMMIT=1 "
                "MIMALLOC_PURGE_DELAY=-1"))
            for arm, preset, ga in cells:
                spec = _spec(preset, ga)
                peak_add = sum(e.peak_add for e in _active(planted, night, arm, preset, ga))
                clock += datetime.timedelta(seconds=60)
                libtpu = env.versions["libtpu"]
                records.append(Record(
                    run_id=plan_id, suite="tpu7x-nightly", arm=arm, about=f"{arm} on a model",
                    spec=spec, config_hash=_config_hash(arm, spec, True),
                    run=RunOptions(steps=steps, warmup=WARMUP, trace=False, trace_steps=0,
                                   parity=False, plan_target="tpu7x:2x2x1", plan_libtpu=libtpu),
                    timestamp=clock.isoformat(), wall_s=60.0, environment=plan_env,
                    plan=_plan(arm, preset, ga, peak_add, libtpu)))
    return records


def write(records: list[Record], directory: Path) -> Path:
    """The records as a history directory: one results file per run id, named as the
    runner names it (`<run id>-<suite>.jsonl`), one JSON line per record."""
    directory.mkdir(parents=True, exist_ok=True)
    by_run: dict[str, list[Record]] = {}
    for record in records:
        by_run.setdefault(f"{record.run_id}-{record.suite}.jsonl", []).append(record)
    for name, group in by_run.items():
        (directory / name).write_text("".join(
            json.dumps(r.to_json(), sort_keys=True) + "\n" for r in group))
    return directory
