"""Grids of cells from command-line options or a named suite (TOML kept in the repo)."""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from pathlib import Path
from typing import Any

from arms.base import check_model
from arms.registry import resolve
from arms.spec import CellSpec
from engine.model import check_fits
from harness.worker import CellRun

SUITES_DIR = Path(__file__).parent / "suites"
RUN_KEYS = ("steps", "warmup", "trace", "trace_steps", "trace_hlo", "parity")
GRID_KEYS = ("preset", "seq", "batch", "ga")
SUITE_ONLY_KEYS = ("description", "arms", "timeout_s", "ragged", "regression_threshold",
                   "cpu_devices", "rounds")
SPEC_KEYS = tuple(f.name for f in dataclasses.fields(CellSpec))


def suite_names() -> list[str]:
    return sorted(p.stem for p in SUITES_DIR.glob("*.toml"))


def load_suite(name: str) -> dict[str, Any]:
    path = SUITES_DIR / f"{name}.toml"
    if not path.exists():
        raise ValueError(f"unknown suite {name!r}; valid suites: {', '.join(suite_names())}")
    with path.open("rb") as f:
        suite = tomllib.load(f)
    unknown = set(suite) - set(SPEC_KEYS) - set(RUN_KEYS) - set(SUITE_ONLY_KEYS)
    if unknown:
        raise ValueError(f"suite {name!r} has unknown keys {sorted(unknown)}")
    suite["name"] = name
    return suite


def _as_list(value) -> list:
    return list(value) if isinstance(value, list | tuple) else [value]


def expand(options: dict[str, Any], *, mesh_sizes: dict[str, int] | None = None) -> list[CellRun]:
    """Every (arm x preset x seq x batch x ga) cell, validated before anything runs.

    `options` holds CellSpec fields (grid keys may be lists), run options, `arms` and
    `ragged` (a list of counts, or a mapping GA -> counts). Raises one ValueError naming
    the fix on the first bad cell.
    """
    arms = _as_list(options.get("arms") or [])
    if not arms:
        raise ValueError("no arms given; pass --arms (e.g. engine,native) or --suite")
    for arm in arms:
        resolve(arm)
    fixed = {k: v for k, v in options.items() if k in SPEC_KEYS and k not in GRID_KEYS
             and k != "ragged" and v is not None}
    run_options = {k: options[k] for k in RUN_KEYS if options.get(k) is not None}
    cells = []
    grid = [_as_list(options.get(k, CellSpec.__dataclass_fields__[k].default))
            for k in GRID_KEYS]
    for preset, seq, batch, ga in itertools.product(*grid):
        ragged = options.get("ragged")
        if isinstance(ragged, dict):
            ragged = ragged.get(str(ga), ragged.get(ga))
        elif ragged is not None and len(ragged) != ga:
            ragged = None  # counts given for another GA do not apply to this cell
        spec = CellSpec(preset=preset, seq=int(seq), batch=int(batch), ga=int(ga),
                        ragged=tuple(ragged) if ragged else None, **fixed)
        if mesh_sizes is not None:
            check_fits(spec.model_config(), spec.mesh or {}, spec.micro_batch)
            _check_device_count(spec.mesh, mesh_sizes)
        if spec.ragged:
            spec.micro_batches()  # validates counts against the micro-batch capacity
        for arm in arms:
            check_model(resolve(arm)[1], spec)  # e.g. what MaxText's Qwen3 cannot express
            cells.append(CellRun(arm=arm, spec=spec.to_dict(), **run_options))
    return cells


def _check_device_count(mesh: str, available: dict[str, int]) -> None:
    from engine.model.sharding import parse_mesh_spec

    need = 1
    for size in parse_mesh_spec(mesh).values():
        need *= size
    have = available["device_count"]
    if need > have:
        hint = ("; on CPU pass --cpu-devices N to emulate N devices"
                if available.get("backend") == "cpu" else "")
        raise ValueError(f"mesh {mesh!r} needs {need} devices but this {available.get('backend')}"
                         f" host has {have}{hint}")
