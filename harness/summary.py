"""One line per finished cell and the end-of-run table (plain text / markdown)."""

from __future__ import annotations


def _fmt(value, spec: str = ".1f", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def cell_name(record: dict) -> str:
    s = record["spec"]
    return (f"{record['arm']} {s['preset']} seq={s['seq']} batch={s['batch']} ga={s['ga']}"
            f"{' mesh=' + s['mesh'] if s.get('mesh') else ''}")


def _status(timing: dict) -> str:
    recompiles = timing.get("recompiles_after_warmup") or 0
    return f"ok, RECOMPILED x{recompiles} after warmup" if recompiles else "ok"


def cell_line(record: dict) -> str:
    if record["status"] != "ok":
        err = record["error"]
        return f"FAILED {cell_name(record)}: {err['reason']}: {err['message']}"
    t, p, tr = record["timing"], record.get("parity") or {}, record.get("trace") or {}
    execs = tr.get("executions_per_step") or [t["executions_per_step_dispatched"]]
    flag = "" if _status(t) == "ok" else f" [{_status(t)}: timing includes compilation]"
    return (f"ok     {cell_name(record)}{flag}: median {t['summary']['median_ms']:.1f} ms "
            f"(cv {t['summary']['cv']:.3f}), {t['tokens_per_s']:.0f} tok/s, "
            f"rel_l2 {_fmt(p.get('rel_l2'), '.2e')}, exec/step {max(execs)}")


HEADER = ("| arm | preset | seq | batch | ga | median ms | p90 ms | max ms | cv | tok/s "
          "| loss | rel_l2 vs exact | exec/step | data | status |")


def table(records: list[dict]) -> str:
    rows = [HEADER, "|" + "|".join(["---"] * (HEADER.count("|") - 1)) + "|"]
    for r in records:
        s = r["spec"]
        if r["status"] != "ok":
            rows.append(f"| {r['arm']} | {s['preset']} | {s['seq']} | {s['batch']} | {s['ga']} "
                        f"| - | - | - | - | - | - | - | - | - | failed: {r['error']['reason']} |")
            continue
        t, p = r["timing"], r.get("parity") or {}
        tr = r.get("trace") or {}
        execs = tr.get("executions_per_step")
        exec_text = (f"{max(execs)} (trace)" if execs else
                     f"{t['executions_per_step_dispatched']} (calls)")
        summ = t["summary"]
        rows.append(
            f"| {r['arm']} | {s['preset']} | {s['seq']} | {s['batch']} | {s['ga']} "
            f"| {summ['median_ms']:.1f} | {summ['p90_ms']:.1f} | {summ['max_ms']:.1f} "
            f"| {summ['cv']:.3f} | {t['tokens_per_s']:.0f} | {_fmt(p.get('loss'), '.5f')} "
            f"| {_fmt(p.get('rel_l2'), '.2e')} | {exec_text} "
            f"| {(p.get('data_fingerprint') or '-')[:10]} | {_status(t)} |")
    return "\n".join(rows)
