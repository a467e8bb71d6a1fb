"""Records as one flat pandas DataFrame: the table every report reads.

`to_frame` gives one row per cell (an arm given one spec of work, in one comparable
environment), its rounds' samples pooled, and one per failed run; the columns hold the cell's
identity, its timing statistics, compiled cost, memory, plan, gradient parity and traced
window, with the raw samples kept as lists. `environment_key` names what two records must
share to be compared, as one readable string.
"""

from __future__ import annotations

import pandas as pd

from reports import medians, noise, stats
from reports.compare import cells
from reports.parity import judge
from reports.record import Environment, Record, sliced_runs
from reports.record.names import decoder_options
from reports.work import flops_per_model_flop


def environment_key(env: Environment | None) -> str:
    """What must match for two records to be compared, as one readable string."""
    if env is None:
        return "unknown environment"
    pins = ", ".join(f"{k} {v}" for k, v in sorted(env.versions.items()) if v)
    malloc = f" / {env.host_malloc}" if env.host_malloc else ""
    return (f"{env.backend} x{env.device_count} {env.device_kind} / processes "
            f"{env.process_count} / XLA_FLAGS {env.xla_flags or 'none'}{malloc} / {pins}")


def loss_label(spec, versions: dict) -> str:
    """The cell's loss as the function it is: Tunix's own GRPO loss with its version and
    options, or this project's losses."""
    if spec.loss == "tunix-grpo":
        clips = "".join(f", {name} {value:g}" for name, value in (
            ("epsilon_high", spec.epsilon_high), ("epsilon_c", spec.epsilon_c))
            if value is not None)
        return (f"tunix.rl.algo_core.grpo_loss_fn (google-tunix "
                f"{versions.get('google-tunix') or 'version unknown'}; loss_agg_mode "
                f"{spec.loss_agg_mode}, beta {spec.beta:g}, epsilon {spec.epsilon:g}{clips}) "
                "on rollouts")
    if spec.loss == "grpo":
        return "GRPO-style clipped surrogate (arms.workload.losses, this project's) on packed rows"
    z = f" + z-loss {spec.z_loss:g}" if spec.z_loss else ""
    return f"next-token cross-entropy{z} (arms.workload.losses)"


def to_frame(records: list[Record]) -> pd.DataFrame:
    """One row per cell (its rounds pooled) and one per failed run, with the columns every
    report reads; raw samples are kept as lists (`runs`: one list per round)."""
    rows = []
    for cell in cells(records):
        if cell.ok:
            rows.append(_row(cell.ok))
        rows += [_row([r]) for r in cell.records if not r.ok]
    return pd.DataFrame(rows)


def _first(records: list[Record], attr: str):
    """The first record's section `attr` that is present (round 0 traces and checks parity;
    later rounds only time)."""
    return next((getattr(r, attr) for r in records if getattr(r, attr) is not None), None)


def _row(records: list[Record]) -> dict:
    """A cell's columns from its records (all ok, or one failed)."""
    r = records[0]
    parity = _first(records, "parity")
    timed = [x for x in records if x.ok and x.timing]  # a plan record has no timing
    runs = [x.timing.step_ms for x in timed if x.timing.step_ms]
    center = medians.median_ci(runs) if runs else None
    return {
        **_cell_columns(r), **_plan_columns(_first(records, "plan")),
        **_timing_columns(r, timed, runs, center), **_cost_columns(r, center),
        **_parity_columns(parity), **_trace_columns(_first(records, "trace")),
        "parity_verdict": judge(r.arm, r.spec, parity),
        "parity_not_checked": None if parity else _first(records, "parity_not_checked"),
    }


def _cell_columns(r: Record) -> dict:
    """What the cell is and how it ran: its arm, spec, status, environment, run options."""
    spec, env, run = r.spec, r.environment, r.run
    return {
        "run_id": r.run_id, "suite": r.suite, "arm": r.arm, "about": r.about,
        "decoder_options": decoder_options(spec),
        "preset": spec.preset, "seq": spec.seq, "batch": spec.batch, "ga": spec.ga,
        "dtype": spec.dtype, "mesh": spec.mesh or "1", "loss_kind": spec.loss,
        "loss_label": loss_label(spec, env.versions if env else {}),
        "ragged": tuple(spec.ragged) if spec.ragged else None, "config_hash": r.config_hash,
        "status": r.status, "error_reason": r.error.reason if r.error else None,
        "error_message": r.error.message if r.error else None,
        "environment": environment_key(env),
        "git_sha": env.git_sha if env else None, "git_dirty": env.git_dirty if env else None,
        "code": env.code() if env else None,
        "backend": env.backend if env else None,
        "device_count": env.device_count if env else None,
        "device_kind": env.device_kind if env else None,
        "steps": run.steps, "warmup": run.warmup, "traced_window": run.trace,
        "plan_target": run.plan_target,
    }


def _timing_columns(r: Record, timed: list[Record], runs: list[list[float]], center) -> dict:
    """The timed windows of the cell's rounds: samples pooled, their median's CI (`center`)
    and the noise warnings; the other step statistics of the first record."""
    timing, run = r.timing, r.run
    return {
        "runs": runs, "rounds": len(runs),
        "round_ids": [(x.run_id, x.round) for x in timed],
        "slices": sliced_runs(timed), "pairing": tuple(run.pairing) if run.pairing else None,
        "step_ms": [t for run_ms in runs for t in run_ms],
        "median_ms": center and center.median, "median_low": center and center.low,
        "median_high": center and center.high,
        "warnings": ([*noise.warnings(runs), *noise.machine_warnings(
            [x.timing.probe_ms for x in timed if x.timing.probe_ms],
            [x.timing.steal for x in timed],
            [x.timing.other_load for x in timed])] if runs else []),
        "busy": stats.busy([x.timing.other_load for x in timed]),
        "mean_ms": _mean([x.timing.stats.mean_ms for x in timed]),
        "max_ms": max((x.timing.stats.max_ms for x in timed), default=None),
        "p90_ms": timing and timing.stats.p90_ms,
        "cv": max((noise.cv(run_ms) for run_ms in runs), default=None),
        "tokens_per_s": (timing.tokens_per_step / (center.median / 1e3)
                         if timing and center else None),
        "compile_s": timing and timing.compile_s,
        "recompiles": max((x.timing.recompiles_after_warmup for x in timed), default=None),
        "compiles": timing and timing.compiles,
        "executions_per_step": timing and timing.executions_per_step,
        "gc_count": timing and timing.gc.count, "gc_ms": timing and timing.gc.total_ms,
        "dispatch_ms": _median(timing.dispatch_ms) if timing else None,
    }


def cost_source(r: Record):
    """Where a run record's compiled FLOPs and bytes per step come from: on an accelerator,
    the plan of its own program its fit check made there (`Record.plan`: the same HLO count
    for every arm), whatever the runtime's cost model gives (on a TPU, a figure for some
    programs and none for others); elsewhere the runtime's loop-aware cost model. Returns
    (source name, compiled FLOPs per step, bytes per step)."""
    cost, env, plan = r.cost, r.environment, r.plan
    if plan is not None and not r.is_plan and env is not None and env.backend != "cpu":
        return "plan", plan.flops_per_step, plan.hbm_bytes_per_step
    if cost is None:
        return None, None, None
    return "runtime", cost.compiled_flops_per_step, cost.bytes_accessed_per_step


def _cost_columns(r: Record, center) -> dict:
    """Compiled cost and memory; model FLOPs per second at the pooled median (`center`)."""
    cost, memory, env = r.cost, r.memory, r.environment
    flops_per_s = (cost.model_flops_per_step / (center.median / 1e3)
                   if cost and cost.model_flops_per_step and center else None)
    source, compiled, accessed = cost_source(r)
    return {
        "model_flops_per_step": cost and cost.model_flops_per_step,
        "model_flops_per_s": flops_per_s,
        "mfu": (cost.mfu_vs_bf16_peak * flops_per_s / cost.model_flops_per_s
                if flops_per_s and cost.mfu_vs_bf16_peak else None),
        "compiled_flops_per_step": compiled, "cost_source": source,
        "flops_per_model_flop": flops_per_model_flop(
            compiled, cost and cost.model_flops_per_step, env and env.device_count),
        "bytes_accessed_per_step": accessed,
        "cost_unavailable": _unavailable(cost.unavailable) if cost else None,
        "peak_bytes": memory and memory.peak_bytes_in_use,
        "peak_reserved": _peak_reserved(memory), "peak_at": peak_at(memory),
        "peak_unavailable": memory and memory.peak_unavailable,
        "planned_bytes": memory and memory.planned_bytes,
        "planned_unavailable": memory and memory.planned_unavailable,
        "rss_delta_bytes": memory and memory.rss_delta_bytes,
        "executables": memory.executables if memory else {},
        "calls_per_step": cost.calls_per_step if cost else {},
    }


def peak_at(memory) -> str | None:
    """Where the devices' peak in use was reached: "build" where it was already reached
    when the build ended (no step raised it: it is the build's, not the step's), "steps"
    where the steps raised it; None where the record has no readings after the build."""
    after = ((memory and memory.device_stats_after) or {}).get("build")
    end = memory and memory.device_stats
    if not after or not end:
        return None
    peaks = [(a or {}).get("peak_bytes_in_use") for a in after]
    finals = [(e or {}).get("peak_bytes_in_use") for e in end]
    if None in peaks or None in finals:
        return None
    return "steps" if max(finals) > max(peaks) else "build"


def _peak_reserved(memory) -> int | None:
    """The most any local device's runtime reserved for its programs' temporaries
    (`memory_stats()['peak_bytes_reserved']`, TPU), None where no device states it."""
    stats = (memory and memory.device_stats) or []
    found = [d["peak_bytes_reserved"] for d in stats if d and "peak_bytes_reserved" in d]
    return max(found, default=None)


def _plan_columns(p) -> dict:
    """A plan record's figures (None elsewhere); bytes are per device."""
    collectives = p and p.collective_bytes_per_step
    return {
        "plan_for": p and p.target,
        "plan_device_kind": p and p.device_kind, "plan_capacity": p and p.hbm_capacity_bytes,
        "plan_peak": p and p.planned_peak_bytes, "plan_peak_executable": p and p.peak_executable,
        "plan_xla_peak": p and p.xla_peak_bytes, "plan_fits": p and p.fits,
        "plan_resident": dict(p.resident_bytes) if p else {},
        "plan_hbm_per_step": p and p.hbm_bytes_per_step,
        "plan_flops_per_step": p and p.flops_per_step,
        "plan_collectives": dict(collectives) if collectives else {},
        "plan_collective_bytes": sum(collectives.values()) if collectives else None,
        "plan_executables": dict(p.executables) if p else {},
        "plan_compile_s": p and p.compile_s, "plan_host_rss": p and p.host_peak_rss_bytes,
        "plan_libtpu": p and p.libtpu, **_roofline_columns(p and p.roofline),
    }


def _roofline_columns(roof) -> dict:
    """A plan's roofline (per device and step, the compiler's figures against the
    datasheet; None elsewhere)."""
    step = roof and roof.step
    collectives = step and step.collective_s
    return {
        "plan_compute_s": step and step.compute_s, "plan_memory_s": step and step.memory_s,
        "plan_collective_s": sum(collectives.values()) if collectives else None,
        "plan_bound_s": step and step.lower_bound_s, "plan_bound_by": step and step.bound_by,
        "plan_model_s": roof and roof.model_compute_s,
        "plan_mfu_ceiling": roof and roof.mfu_ceiling,
        "plan_datasheet": roof and roof.datasheet,
    }


def _unavailable(why: dict[str, str]) -> str | None:
    """'fwd_bwd, update: <reason>' per distinct reason; None when every cost is known."""
    by_reason: dict[str, list[str]] = {}
    for executable, reason in why.items():
        by_reason.setdefault(reason, []).append(executable)
    return "; ".join(f"{', '.join(names)}: {reason}"
                     for reason, names in by_reason.items()) or None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _parity_columns(p) -> dict:
    return {"loss": p and p.loss, "exact_loss": p and p.exact_loss, "rel_l2": p and p.rel_l2,
            "float32_rel_l2": p and p.float32_rel_l2, "grad_l2": p and p.grad_l2,
            "denominator": p and p.denominator,
            "trainer_denominator": p and p.trainer_denominator,
            "denominators": tuple(p.denominators) if p else (),
            "data_digest": p and p.data_digest}


def _trace_columns(t) -> dict:
    return {"trace_executions": max(t.executions_per_step) if t and t.executions_per_step
            else None,
            "trace_step_ms": _median(t.step_ms) if t else None,
            "trace_busy_ms": _median(t.busy_ms) if t else None,
            "trace_host_ms": _median(t.host_ms) if t else None,
            "xplane": t and t.xplane, "trace_logdir": t and t.logdir}


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
