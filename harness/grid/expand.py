"""The cells of a grid: every (arm x preset x seq x batch x ga) of the options, each checked
before anything runs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

from arms.base import check_model
from arms.registry import resolve
from arms.spec import DECODER_OPTIONS, CellSpec
from engine.model import check_fits, parse_mesh_spec
from harness.contract import CellRun

RUN_KEYS = ("steps", "warmup", "trace", "trace_steps", "trace_hlo", "parity", "fit_check",
            "fit_bytes")
"""Options of how a cell runs (CellRun fields)."""
GRID_KEYS = ("preset", "seq", "batch", "ga")
"""The options a grid may give several values of: one cell per combination."""
SPEC_KEYS = tuple(f.name for f in dataclasses.fields(CellSpec))


def _check_no_repeats(key: str, values: list) -> None:
    """A value given twice would run the same cell twice, each recorded as round 0: the
    report would pool them as two rounds of one run. Repeats are refused; rounds are what
    --rounds is for."""
    seen = set()
    for value in values:
        if value in seen:
            raise ValueError(f"--{key} names {value} twice ({','.join(map(str, values))}); "
                             f"give each value once, and --rounds N to run each cell N times")
        seen.add(value)


def _as_list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def expand(options: dict[str, Any], *, mesh_sizes: dict[str, int] | None = None,
           allow_empty: bool = False) -> list[CellRun]:
    """Every (arm x preset x seq x batch x ga) cell, validated before anything runs.

    `options` holds CellSpec fields (grid keys may be lists), run options, `arms`, `ragged`
    (a list of counts, or a mapping GA -> counts), instead of `batch`, `micro_batch`:
    rows per micro-batch (a number, a list, or a table by seq, whose entries may be tables
    by GA), each cell's batch then micro_batch x its GA, and `decoder`: our decoder's
    options by shape (`decoder_table_at`). Raises one ValueError naming the fix on the first
    bad cell, or where no cell is left (unless `allow_empty`).
    """
    arms = _as_list(options.get("arms") or [])
    if not arms:
        raise ValueError("no arms given; pass --arms (e.g. engine,native) or --suite")
    for arm in arms:
        resolve(arm)
    _check_no_repeats("arms", arms)
    fixed = {k: v for k, v in options.items() if k in SPEC_KEYS and k not in GRID_KEYS
             and k != "ragged" and v is not None}
    run_options = {k: options[k] for k in RUN_KEYS if options.get(k) is not None}
    cells = []
    micro = options.get("micro_batch")
    if micro is not None and options.get("batch") is not None:
        raise ValueError("give the batch as --batch (rows per step) or --micro-batch (rows "
                         "per micro-batch), not both")
    grid = [_as_list(options.get(k, CellSpec.__dataclass_fields__[k].default))
            for k in GRID_KEYS]
    if micro is not None:
        grid[GRID_KEYS.index("batch")] = [None]
    for key, values in zip(GRID_KEYS, grid, strict=True):
        _check_no_repeats(key, values)
    _check_ragged_applies(options.get("ragged"), grid[GRID_KEYS.index("ga")])
    for preset, seq, batch, ga, shape_arms in _shapes(grid, micro, arms):
        ragged = _ragged_at(options.get("ragged"), ga)
        spec = CellSpec(preset=preset, seq=int(seq), batch=int(batch), ga=int(ga),
                        ragged=tuple(ragged) if ragged else None, **fixed)
        mesh = parse_mesh_spec(spec.mesh, mesh_sizes and mesh_sizes["device_count"])
        check_fits(spec.model_config(), mesh, spec.micro_batch)
        if mesh_sizes is not None:
            _check_device_count(spec.mesh, mesh, mesh_sizes)
        if spec.ragged:
            spec.micro_batches(logprobs=False)  # validates counts against the micro-batch capacity
        ours = decoder_table_at(options.get("decoder"), seq, ga, given=fixed)
        on_decoder = dataclasses.replace(spec, **ours) if ours else spec
        for arm in shape_arms:
            model = resolve(arm)[1]
            arm_spec = on_decoder if model == "decoder" else spec
            check_model(model, arm_spec)  # e.g. what MaxText's Qwen3 cannot express
            cells.append(CellRun(arm=arm, spec=arm_spec.to_dict(), **run_options))
    if not cells and not allow_empty:
        empty = ", ".join(dict.fromkeys(f"seq {seq} GA {ga}"
                                        for _, seq, _, ga in itertools.product(*grid)))
        raise ValueError(f"no cell to run: micro_batch gives no rows at {empty} (no arm fits "
                         "there; the suite's notes say what was planned); pass --batch B "
                         "(B rows a step, a multiple of GA) to run that shape anyway")
    return cells


def _ragged_at(ragged, ga):
    """The loss-token counts of `ragged` (a list, or a mapping GA -> counts) for cells at
    `ga`: counts given for another GA of the grid do not apply."""
    if isinstance(ragged, dict):
        return ragged.get(str(ga), ragged.get(ga))
    return ragged if ragged is not None and len(ragged) == ga else None


def _shapes(grid: list[list], micro, arms: list[str]) -> list[tuple]:
    """(preset, seq, batch, ga, the arms with a cell of that shape) of the grid's values
    (`GRID_KEYS` order), each batch `micro`'s rows x GA where rows per micro-batch are given."""
    shapes = []
    for preset, seq, batch, ga in itertools.product(*grid):
        if not micro:
            shapes.append((preset, seq, batch, ga, arms))
            continue
        by_arm = _rows(micro, seq, ga, arms)
        for rows in dict.fromkeys(r for arm in arms for r in by_arm[arm]):
            shapes.append((preset, seq, rows * int(ga), ga,
                           [arm for arm in arms if rows in by_arm[arm]]))
    return shapes


def decoder_table_at(table, seq, ga, *, given=()) -> dict[str, Any]:
    """Our decoder's options at (`seq`, `ga`) from a suite's `decoder` table: by seq, then
    optionally by GA, of our decoder's options ({"4096": {"4": {"logits_chunk": 512}}}:
    how the decoder computes where a shape needs it, e.g. a chunked loss where whole logits
    do not fit). They apply to the arms on our decoder only: MaxText's and Tunix's models
    compute their own attention and logits, so their cells keep the defaults, and say so.
    A shape the table does not name keeps the defaults; an option in `given` (a value given
    for every cell, on the command line or at the suite's top level) is not overridden."""
    if not table:
        return {}
    found = table
    for key in (seq, ga):  # a table keyed by numbers is by seq (then GA); one of options holds
        if isinstance(found, dict) and found and all(str(k).isdigit() for k in found):
            found = found.get(str(key), found.get(key, {}))
    if not isinstance(found, dict) or not set(found) <= set(DECODER_OPTIONS):
        raise ValueError(f"decoder table at seq {seq} GA {ga} gives {found!r}; give a table "
                         f"of our decoder's options ({', '.join(DECODER_OPTIONS)}) by seq, "
                         "then optionally by GA")
    return {k: v for k, v in found.items() if k not in given}


def _rows(micro, seq, ga, arms: list[str]) -> dict[str, list[int]]:
    """Each arm's micro-batch sizes in cells of length `seq` at `ga`: `micro` itself (one,
    or a list), or, where it is a table by sequence length ({"1024": 2, "4096": 1}: the most
    rows that fit a device differ with the length), its entry for `seq`, which may in turn
    be a table by GA ({"1": 2, "4": 1}: a step that scans its micro-batches holds more),
    whose entry may be a table by arm ({"engine": 1, "peft-tunix": []}: what fits differs by
    arm). An empty list is no cell at that shape (nothing fits it)."""
    for key, name in ((seq, "seq"), (ga, "ga")):
        if isinstance(micro, dict):
            found = micro.get(str(key), micro.get(key))
            if found is None:
                raise ValueError(f"micro_batch gives rows for {name} "
                                 f"{', '.join(map(str, micro))} but not for {name} {key}; "
                                 f"give one for every {name} of the grid")
            micro = found
    if isinstance(micro, dict):
        lacking = [arm for arm in arms if arm not in micro]
        if lacking:
            raise ValueError(f"micro_batch gives rows at seq {seq} GA {ga} for arms "
                             f"{', '.join(micro)} but not for {', '.join(lacking)}; give "
                             "rows for every arm of the grid (an empty list: no cell)")
    found = {arm: [int(r) for r in _as_list(micro[arm] if isinstance(micro, dict) else micro)]
             for arm in arms}
    for rows in found.values():
        _check_no_repeats("micro-batch", rows)
        if any(r < 1 for r in rows):
            raise ValueError(f"--micro-batch {','.join(map(str, rows))}: give at least 1 row")
    return found


def _check_ragged_applies(ragged, gas: list) -> None:
    """Counts given as a list apply where their length equals GA: refuse counts that apply
    to no cell of the grid rather than silently run every cell unragged."""
    if ragged is None or isinstance(ragged, dict):
        return
    if not any(len(ragged) == int(ga) for ga in gas):
        raise ValueError(
            f"--ragged gives {len(ragged)} counts but no cell has ga={len(ragged)} (ga: "
            f"{', '.join(str(g) for g in gas)}); give one count per micro-batch of a GA in "
            "the grid")


def _check_device_count(spec: str, mesh: dict[str, int], available: dict) -> None:
    need = math.prod(mesh.values())
    have = available["device_count"]
    if need > have:
        hint = ("; on CPU pass --cpu-devices N to emulate N devices"
                if available.get("backend") == "cpu" else "")
        where = (f"the target {available['target']}" if available.get("target")
                 else f"this {available.get('backend')} host")
        raise ValueError(f"mesh {spec!r} needs {need} devices but {where} has {have}{hint}")
