"""Schema versions of the record's JSON layout, and how each earlier one is upgraded.

Every record carries the version of its layout in its `schema` field, and `SCHEMA` is the
version `Record.to_json` writes. A reader passes data of any version through `upgrade` before
checking it: a renamed field gets its current name, a value that cannot be carried over is
dropped as unavailable with the reason, and a field the data lacks keeps its default. So data
of any version this reader knows reads as a current record, and data of a version it does not
know raises `RecordError`.
"""

from __future__ import annotations

from reports.record.errors import RecordError

SCHEMA = 14
"""Version of the layout `to_json` writes. 1: the environment was `fingerprint`, the
compiled cost `flops`, the step statistics `timing.summary`, the data digest
`parity.data_fingerprint`, the executions `timing.executions_per_step_dispatched`.
2: XLA's compiled FLOPs and bytes were not loop-aware (a while-loop body counted once), there
were no model FLOPs, and the round lived only in the A/B tag. 3: there were no plans (no
`plan` section, no `run.plan_target`). 4: a plan had no roofline and did not name its
compiler's build (`plan.roofline`, `plan.libtpu_build`). 5: the spec had no options of the
tunix-grpo loss (`spec.loss_agg_mode`, `beta`, `epsilon`, `epsilon_high`, `epsilon_c`), and
no trainer's denominator (`parity.trainer_denominator`). 6: a record's planned bytes were the
largest executable's total, whichever the step called, without the train state held outside
its arguments (`memory.executables[*].held`). 7: a gradient check that gave no verdict left
no reason (`parity_not_checked`), and a run record held no plan of its device. 8: a record
held no device's whole memory statistics (`memory.device_stats`). 9: a record had no compile
log (`timing.compile_log`), no memory readings after the build and the warmup
(`memory.device_stats_after`), and no cost of its reference (`parity.reference_s`,
`parity.reference_computed_s`); its gradient check read a capture chained into the timed
step (`run.parity`: the step timed was the trainer's with the capture in front of its
optimizer); its spec had none of our decoder's attention and logits options
(`spec.attention`, `attention_block_q`, `attention_block_kv`, `logits_chunk`). 10: a plan of
the program with the capture said so in `run.plan_capture`, and a checked run's timed capture
went unsaid (both are `run.capture`). 11: the environment named no tree of the files that
ran (`environment.git_tree`), and its `git_dirty` was `git status` of the tracked files
alone. 12: a gradient check did not say the arm's distance from exact float32
(`parity.float32_rel_l2`). 13: the spec had no `scan_backward` (every cell's was "jax")."""


def upgrade(data: dict, where: str = "record") -> dict:
    """`data` in the current schema's layout (a copy); raises RecordError for an unknown one."""
    schema = data.get("schema")
    if schema == SCHEMA:
        return data
    if isinstance(schema, int) and 1 <= schema < SCHEMA:
        return _upgrade_10(_upgrade_9(data), schema)
    raise RecordError(f"{where}: not a parity record (schema {schema!r}, this version "
                      f"reads 1-{SCHEMA})")


def _upgrade_10(data: dict, schema: int) -> dict:
    """`run.plan_capture` (schema 10) is `run.capture`, which a checked run of schema < 10
    also sets: its timed step carried the capture."""
    run = data.get("run")
    if not isinstance(run, dict):
        return data
    run = dict(run)
    captured = bool(run.pop("plan_capture", False))
    if schema < 10 and not run.get("plan_target") and run.get("parity"):
        captured = True
    if captured:
        run["capture"] = True
    return dict(data, run=run)


def _upgrade_9(data: dict) -> dict:
    """A record of schema 1-13 in the layout of schema 13, marked with the current schema."""
    schema = data.get("schema")
    if schema in (7, 8, 9, 10, 11, 12, 13):  # 8-14 added fields
        return dict(data, schema=SCHEMA)
    if schema in (3, 4, 5, 6):  # 4-6 added fields (plans, roofline, loss options)
        return _upgrade_6(dict(data, schema=SCHEMA))
    if schema == 2:
        return _upgrade_6(_upgrade_2(data))
    data = dict(data, schema=2)  # schema 1
    data["environment"] = data.pop("fingerprint", None)
    if data.get("timing"):
        timing = data["timing"] = dict(data["timing"])
        timing["stats"] = timing.pop("summary")
        timing["executions_per_step"] = timing.pop("executions_per_step_dispatched")
    flops = data.pop("flops", None)
    if flops:
        data["cost"] = {"flops_per_step": flops["per_step"], "flops_per_s": flops["flops_per_s"],
                        "mfu_vs_bf16_peak": flops["mfu_vs_bf16_peak"],
                        "flops_per_executable": flops["per_executable"],
                        "calls_per_step": flops["calls_per_step"],
                        "bytes_accessed_per_step": flops.get("bytes_accessed_per_step"),
                        "bytes_accessed_per_executable":
                            flops.get("bytes_accessed_per_executable")}
    if data.get("parity"):
        parity = data["parity"] = dict(data["parity"])
        parity["data_digest"] = parity.pop("data_fingerprint")
    return _upgrade_6(_upgrade_2(data))


def _upgrade_6(data: dict) -> dict:
    """Schema <= 6 -> 7. A step of one executable takes the whole train state as its
    arguments, so its planned bytes read the same either way; a step of several (a split
    fwd/bwd + update) left the state held outside an executable uncounted, so its planned
    bytes are dropped as unknown rather than carried over silently low."""
    memory = data.get("memory")
    if memory and len(memory.get("executables") or {}) > 1:
        data["memory"] = dict(memory, planned_bytes=None, planned_unavailable=(
            "a record of schema < 7 of a step of several executables: the train state held "
            "beside an executable was not counted"))
    return data


def _upgrade_2(data: dict) -> dict:
    """Schema 2 -> 4. Its compiled FLOPs and bytes counted a while-loop body once, so they
    are dropped as unavailable rather than carried over silently low."""
    data = dict(data, schema=SCHEMA)
    if data.get("ab"):
        ab = data["ab"] = dict(data["ab"])
        data["round"] = ab.pop("round", 0)
    cost = data.get("cost")
    if cost:
        names = list(cost.get("flops_per_executable") or {})
        why = "schema-2 record: XLA's count was not loop-aware"
        data["cost"] = {
            "model_flops_per_step": None, "model_flops_per_s": None, "mfu_vs_bf16_peak": None,
            "compiled_flops_per_step": None, "bytes_accessed_per_step": None,
            "calls_per_step": cost["calls_per_step"],
            "compiled_flops_per_executable": dict.fromkeys(names),
            "bytes_accessed_per_executable": dict.fromkeys(names),
            "loop_trip_counts": {}, "unavailable": dict.fromkeys(names, why)}
    return data
