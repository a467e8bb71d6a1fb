"""Where parity keeps what it writes: the one owner of every path under `--out`, of run
ids, and of what the cells of one run share while it runs.

An out directory (`parity run/plan/ab --out`, `parity nightly --history`) holds:

    <run id>[-<suite>].jsonl         one record per line (harness.store.results)
    traces/<run id>/<cell>/...       profiler captures (`--trace`), a logdir per cell
    hlo/<run id>/<cell>/<exe>.hlo.txt  optimized TPU HLO of each planned executable
    .plan-cache/<key>.json.gz        plans read back by later plans of the same program
    ab.md                            the A/B comparison (`parity ab`)
    bisect.md                        the bisection's steps and its commit (`parity bisect`)
    nightly/                         the nightly's markdown and plots (default --report)

where `<cell>` is `<arm>-<preset>-s<seq>-b<batch>-ga<ga>[-r<round>]` (`cell_path`). A run's
shared store (`RunStore`, a temp dir for the run's duration) holds a compilation cache per
run (kept elsewhere with $PARITY_COMPILE_CACHE: `compile_root`), the exact references, and
the zygotes' logs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from harness.contract import COMPILE_CACHE, REFERENCE_DIR
from harness.system.reaper import REAPER
from reports.record import path_safe

_issued: set[str] = set()


def compile_root(store_root: Path) -> Path:
    """Where the cells of a run keep what outlives a cell: under $PARITY_COMPILE_CACHE where
    the run's own environment sets it, kept after the run (so a later run, or a resumed
    one, loads the programs an earlier run compiled: on an accelerator the first compile of
    a 0.6 B model's step and initializer takes tens of seconds a cell), else the run's temp
    store, gone with it. It holds `xla/`, the JAX compilation cache every arm of the run
    shares (a loaded program is the executable a cold compile builds; the records count
    the cache hits), and, unless $PARITY_REFERENCE_DIR says otherwise, `reference/`, the
    exact references (harness.cell.reference_store)."""
    kept = os.environ.get(COMPILE_CACHE)
    return Path(kept) if kept else store_root


def reference_root(store_root: Path) -> Path:
    """Where the run's cells keep the exact references, for every later run too:
    $PARITY_REFERENCE_DIR where set, else `reference/` beside a kept compilation cache
    ($PARITY_COMPILE_CACHE), else the user's cache directory
    (`${XDG_CACHE_HOME:-~/.cache}/parity/reference`). A reference is computed once per piece
    of work and the code and stack computing it (harness.cell.reference_store), the store
    size-bounded; `store_root` is unused where the environment names neither."""
    kept = os.environ.get(REFERENCE_DIR)
    if kept:
        return Path(kept)
    if os.environ.get(COMPILE_CACHE):
        return compile_root(store_root) / "reference"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "parity" / "reference"


def new_run_id(prefix: str = "") -> str:
    """A timestamp to the microsecond and this process's id, so two runs started at the
    same moment on one host differ; within a process, an id never repeats."""
    while True:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        run_id = f"{prefix}{now}-p{os.getpid()}"
        if run_id not in _issued:
            _issued.add(run_id)
            return run_id


def check_run_id(run_id: str) -> None:
    """A run id names a results file inside --out: one plain file name. A separator or '..'
    would write outside --out (or below it, where no reader looks)."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id:
        raise ValueError(f"--run-id {run_id!r}: give a plain name (no '/', not '..'); the "
                         "results file is <out>/<run id>.jsonl, and --out chooses where")


def cell_path(run_id: str, arm: str, spec: dict, round_index: int = 0) -> str:
    """A cell's directory below a run's traces or HLO: '<run id>/<arm>-<preset>-s<seq>-
    b<batch>-ga<ga>', with '-r<round>' for a round other than 0. The grid varies only these
    keys within a run, so the name tells the cells apart; a cell listed twice gets '-2'
    from the capture (harness.measure.trace.claim_directory)."""
    name = f"{arm}-{spec['preset']}-s{spec['seq']}-b{spec['batch']}-ga{spec['ga']}"
    if round_index:
        name += f"-r{round_index}"
    return f"{path_safe(run_id)}/{path_safe(name)}"


class OutDir:
    """The paths of one out directory (see the module docstring)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def results(self, run_id: str, suite: str | None = None) -> Path:
        """The results file of run `run_id` (one JSON record per line)."""
        return self.root / f"{run_id}{'-' + suite if suite else ''}.jsonl"

    @property
    def traces(self) -> Path:
        return self.root / "traces"

    @property
    def hlo(self) -> Path:
        return self.root / "hlo"

    @property
    def plan_cache(self) -> Path:
        return self.root / ".plan-cache"

    @property
    def ab_markdown(self) -> Path:
        return self.root / "ab.md"

    @property
    def bisect_markdown(self) -> Path:
        return self.root / "bisect.md"

    @property
    def nightly_report(self) -> Path:
        return self.root / "nightly"


class RunStore:
    """What the cells of one run share while it runs (a directory):
    - a persistent compilation cache (`compile_root`), shared by every cell of the run (its
      rounds, its shapes and its arms), so a program compiled earlier in the run, or by the
      fit check of the same cell, loads instead of compiling again; records count the hits
      (Timing.compile_cache_hits) and name each program compiled (Timing.compile_log);
    - the exact reference gradients (`reference_root`), one per piece of work (every arm
      of a shape is given the same work), computed by the first cell that checks parity and
      read by the others (Parity.reference_shared), size-bounded;
    - the logs of the zygotes that fork the run's workers."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    @classmethod
    @contextlib.contextmanager
    def temporary(cls, root: str | Path | None = None) -> Iterator[RunStore]:
        """The store at `root`, or in a fresh temp dir removed afterwards (and by the reaper
        if this process is killed)."""
        if root is not None:
            Path(root).mkdir(parents=True, exist_ok=True)
            yield cls(root)
            return
        with tempfile.TemporaryDirectory(prefix="parity-store-") as tmp, \
                REAPER.watch("path", path=tmp):
            yield cls(tmp)

    def cell_env(self) -> dict[str, str]:
        """The variables that point a worker at what it shares with the run's other cells."""
        return {COMPILE_CACHE: str(compile_root(self.root) / "xla"),
                REFERENCE_DIR: str(reference_root(self.root))}

    def zygote_log(self, arm: str, number: int) -> Path:
        return self.root / f"zygote-{path_safe(arm)}-{number}.log"
