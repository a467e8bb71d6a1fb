"""What a person watching a run sees: one line per finished cell and the end-of-run table."""

from __future__ import annotations

from reports.parity import parity_verdict
from reports.record import Record, Spec, cell_name, section
from reports.work import different_work, record_ratio


def _fmt(value, spec: str = ".1f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


__all__ = ["cell_line", "cell_name", "plan_table", "table"]


def _status(record: Record) -> str:
    recompiles = record.timing.recompiles_after_warmup
    return f"ok, RECOMPILED x{recompiles} after warmup" if recompiles else "ok"


def _executions(record: Record) -> int:
    trace = record.trace
    return (max(trace.executions_per_step) if trace and trace.executions_per_step
            else record.timing.executions_per_step)


def parity_failed(record: Record) -> bool:
    """The cell ran, checked gradient parity and failed it (reports.parity)."""
    verdict = parity_verdict(record) if record.ok else None
    return verdict is not None and not verdict.passed


def start_line(arm: str, spec: dict, round_index: int, number: int, total: int) -> str:
    """'[3/8] start engine small seq=128 batch=8 ga=4 round 1'."""
    name = cell_name(arm, section(Spec, spec)) + (f" round {round_index}" if round_index else "")
    return f"[{number}/{total}] start {name}"


def other_work(record: Record, earlier: list[Record]) -> str:
    """'different work (compiled/model FLOPs X vs Y of ARM)' when the first arm of the same
    spec among the `earlier` records (the shape's first arm in run order) computes more than
    WORK_TOLERANCE more or less per model FLOP (reports.work); '' otherwise."""
    first = next((other for other in earlier if other.ok and other.arm != record.arm
                  and other.config_hash == record.config_hash
                  and record_ratio(other) is not None), None)
    if first is None:
        return ""
    differ = different_work(record_ratio(record), record_ratio(first))
    return f"{differ.removesuffix(')')} of {first.arm})" if differ else ""


def _gib(value) -> str:
    return "-" if value is None else f"{value / 2**30:.3f} GiB"


def plan_line(record: Record) -> str:
    """A planned cell: its peak against the capacity, traffic and collectives per step."""
    p = record.plan
    fits = "" if p.fits is None else " (fits)" if p.fits else " (DOES NOT FIT)"
    collectives = (sum(p.collective_bytes_per_step.values())
                   if p.collective_bytes_per_step else None)
    return (f"planned peak {_gib(p.planned_peak_bytes)} of {_gib(p.hbm_capacity_bytes)}"
            f"{fits} on {p.target}, resident {_gib(sum(p.resident_bytes.values()))}, HBM "
            f"{_gib(p.hbm_bytes_per_step)}/step, collectives {_gib(collectives)}/step, "
            f"compiled in {p.compile_s:.0f} s{_hlo_stage(p)}")


def _hlo_stage(plan) -> str:
    """" (HLO passes N s)": the compile's seconds until its figures were fixed, where every
    executable compiled here says."""
    stages = [e.hlo_stage_s for e in plan.executables.values() if not e.cached]
    if not stages or any(s is None for s in stages):
        return ""
    return f" (HLO passes {sum(stages):.0f} s)"


def cell_line(record: Record, earlier: list[Record] = ()) -> str:
    """The finished cell: timing, gradient parity as a verdict (a FAIL leads the line), and
    whether it does other work than the `earlier` records of its shape; a plan's figures."""
    name = cell_name(record.arm, record.spec) + (f" round {record.round}" if record.round else "")
    if record.unavailable:
        return f"skip   {name}: {record.error.message}"
    if not record.ok:
        return f"FAILED {name}: {record.error.reason}: {record.error.message}"
    if record.is_plan:
        head = "ok    " if record.plan.fits is not False else "NO FIT"
        return f"{head} {name}: {plan_line(record)}"
    t = record.timing
    flag = "" if _status(record) == "ok" else f" [{_status(record)}: timing includes compilation]"
    verdict = parity_verdict(record)
    parity = (f"parity {verdict.text()}" if verdict is not None else
              f"parity not checked ({record.parity_not_checked[:200]})"
              if record.parity_not_checked else "parity not checked")
    head = "PARITY FAIL" if parity_failed(record) else "ok    "
    differ = other_work(record, list(earlier))
    tail = ("; its time is not comparable work" if parity_failed(record)
            else f"; {differ}: its time is not comparable work" if differ else "")
    twice = compiled_twice(t.compile_log or [])
    if twice:
        tail += (f"; compiled twice: {', '.join(twice)} (the build did not load what the fit "
                 "check compiled: is the compilation cache off?)")
    return (f"{head} {name}{flag}: median {t.stats.median_ms:.1f} ms "
            f"(cv {t.stats.cv:.3f}), {t.tokens_per_s:.0f} tok/s, exec/step "
            f"{_executions(record)}, {parity}{tail}")


def compiled_twice(log: list[dict]) -> list[str]:
    """Programs a cell's process compiled cold in its fit check and again in its build
    (its compile log, Timing.compile_log): none where the build loaded the check's."""
    fitted = {e["program"] for e in log if e["phase"] == "fit" and not e["cached"]}
    return sorted({e["program"] for e in log
                   if e["phase"] == "build" and not e["cached"] and e["program"] in fitted})


HEADER = ("| arm | preset | seq | batch | ga | median ms | p90 ms | max ms | cv | tok/s "
          "| loss | rel_l2 vs exact | exec/step | data | status |")


PLAN_HEADER = ("| arm | preset | seq | batch | ga | mesh | dtype | planned peak GiB | fits "
               "| resident GiB | HBM GiB/step | collective GiB/step | TFLOP/step "
               "| lower bound ms/step | bound by | MFU ceiling | compile s | status |")

ROOFLINE_NOTE = (
    "Per device. lower bound ms/step: the least time a step of this program can take on the "
    "target, max(FLOPs / peak, HBM bytes / HBM bandwidth, collective bytes / interconnect) "
    "per call, summed over the step's calls; MFU ceiling: the step's model FLOPs at peak / "
    "that bound. The compiler's figures against the device's datasheet "
    "(harness.measure.devices), not a measurement.")


def plan_table(records: list[Record]) -> str:
    """The end-of-run table of `parity plan`."""
    rows = [PLAN_HEADER, "|" + "|".join(["---"] * (PLAN_HEADER.count("|") - 1)) + "|"]
    for r in records:
        s = r.spec
        cell = f"| {r.arm} | {s.preset} | {s.seq} | {s.batch} | {s.ga} | {s.mesh or '1'} " \
               f"| {s.dtype} "
        if not r.ok:
            rows.append(f"{cell}|{' - |' * 10} failed: {r.error.reason} |")
            continue
        p = r.plan
        collectives = (sum(p.collective_bytes_per_step.values())
                       if p.collective_bytes_per_step else None)
        step = p.roofline and p.roofline.step
        bound = step and step.lower_bound_s
        rows.append(
            f"{cell}| {p.planned_peak_bytes / 2**30:.3f} | "
            f"{'-' if p.fits is None else 'yes' if p.fits else 'NO'} "
            f"| {sum(p.resident_bytes.values()) / 2**30:.3f} "
            f"| {_fmt(p.hbm_bytes_per_step and p.hbm_bytes_per_step / 2**30, '.3f')} "
            f"| {_fmt(collectives and collectives / 2**30, '.3f')} "
            f"| {_fmt(p.flops_per_step and p.flops_per_step / 1e12, '.3f')} "
            f"| {_fmt(bound and bound * 1e3, '.2f')} | {(step and step.bound_by) or '-'} "
            f"| {_fmt(p.roofline and p.roofline.mfu_ceiling, '.1%')} "
            f"| {p.compile_s:.0f} | ok |")
    return "\n".join(rows)


def table(records: list[Record]) -> str:
    rows = [HEADER, "|" + "|".join(["---"] * (HEADER.count("|") - 1)) + "|"]
    for r in records:
        s = r.spec
        cell = f"| {r.arm} | {s.preset} | {s.seq} | {s.batch} | {s.ga} "
        if not r.ok:
            status = "not run here" if r.unavailable else f"failed: {r.error.reason}"
            rows.append(f"{cell}| - | - | - | - | - | - | - | - | - | {status} |")
            continue
        t, p = r.timing, r.parity
        how = "(trace)" if r.trace and r.trace.executions_per_step else "(calls)"
        rows.append(
            f"{cell}| {t.stats.median_ms:.1f} | {t.stats.p90_ms:.1f} | {t.stats.max_ms:.1f} "
            f"| {t.stats.cv:.3f} | {t.tokens_per_s:.0f} | {_fmt(p and p.loss, '.5f')} "
            f"| {_fmt(p and p.rel_l2, '.2e')} | {_executions(r)} {how} "
            f"| {((p and p.data_digest) or '-')[:10]} | {_status(r)}"
            f"{', parity FAIL' if parity_failed(r) else ''} |")
    return "\n".join(rows)
