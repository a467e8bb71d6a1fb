"""Runs a grid: one subprocess per cell, a record per cell whatever happens to it."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from harness import results
from harness.environment import host_malloc
from harness.pool import run_keyed
from harness.reaper import REAPER, die_with_parent, raise_if_signalled
from harness.worker import (
    COMPILE_CACHE,
    OOM_MARKERS,
    PEER_MARKERS,
    REFERENCE_DIR,
    SPAWNED_AT,
    CellRun,
)
from harness.zygote import Zygote, ZygoteError
from reports.record import (
    ABTag,
    Environment,
    Failure,
    Record,
    RunOptions,
    Spec,
    cell_name,
    section,
)

STDERR_TAIL = 4000


def cpu_env(cpu_devices: int | None, base: dict | None = None) -> dict[str, str]:
    """The environment cells run in; `cpu_devices` emulates that many CPU devices."""
    env = dict(os.environ if base is None else base)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if cpu_devices:
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env["XLA_FLAGS"] = " ".join(flags)
    return env


HOST_MALLOC = {"MALLOC_ARENA_MAX": "1", "MALLOC_MMAP_MAX_": "0",
               "MALLOC_TRIM_THRESHOLD_": str(2**32 - 1)}
"""glibc settings for cells on the CPU backend: freed memory stays in the process.

XLA's CPU runtime mallocs each execution's temp buffer and frees it when the execution ends.
By default glibc serves a request over 32 MiB with a fresh mmap, gives each worker thread an
arena whose emptied heaps are unmapped, and trims the main heap's top: each way, the next
execution faults its temp in again page by page, a cost of executions x temp size (the split
engine at `small` seq 128 GA 4: 48k page faults, 190 MiB, per step; the single-jit arms 17k).
An accelerator runtime pools device memory and pays none of this, so the CPU proxy turns it
off: one arena, no mmap, no trim (all three are needed; any two leave the faults). The cost
is a resident set that stays at its high-water mark."""


def cell_environment(cpu_devices: int | None, *,
                     planning: bool = False) -> tuple[dict[str, str], dict]:
    """(env, environment): the variables cells run with and the environment they will
    record (from one `probe`). On the CPU backend `env` carries HOST_MALLOC; cells that
    plan (`planning`: they compile for a TPU target and run nothing) preload mimalloc
    instead (harness.plan.target.compile_env). A user's own allocator settings (a glibc
    malloc variable, a preloaded malloc) are kept either way, and recorded."""
    env = cpu_env(cpu_devices)
    environment = probe(env)
    if not host_malloc(env):  # else the user's own allocator is kept
        if planning:
            from harness.plan.target import compile_env

            env = compile_env(env)
        elif environment["backend"] == "cpu":
            env.update(HOST_MALLOC)
    environment["host_malloc"] = host_malloc(env)
    return env, environment


def probe(env: dict[str, str], timeout_s: float = 120) -> dict:
    """The environment cells will see (harness.environment), from a short subprocess."""
    proc = subprocess.run([sys.executable, "-m", "harness.environment"], env=env,
                          capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=die_with_parent(os.getpid()))
    if proc.returncode != 0:
        raise RuntimeError(f"could not start JAX in a subprocess:\n{proc.stderr[-STDERR_TAIL:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _failure(reason: str, message: str, stderr: str) -> Record:
    return Record(status="failed", error=Failure(reason=reason, message=message,
                                                 stderr_tail=stderr[-STDERR_TAIL:]))


def _oom_kills() -> int | None:
    """The kernel's count of OOM kills in this process's memory cgroup (v2 `memory.events`,
    else v1 `memory.oom_control`); None where neither is readable."""
    candidates = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0":
                candidates.append(Path("/sys/fs/cgroup", path.lstrip("/"), "memory.events"))
            elif "memory" in controllers.split(","):
                candidates += [Path("/sys/fs/cgroup/memory", path.lstrip("/"),
                                    "memory.oom_control"),
                               Path("/sys/fs/cgroup/memory/memory.oom_control")]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            for line in candidate.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Exit:
    """How a cell process ended, as the runner saw it."""

    code: int | None
    """Exit status (negative: killed by that signal); None when the runner killed it at
    its timeout."""
    stderr: str
    wrote_record: bool
    max_rss_bytes: int | None = None
    """The process's peak resident memory (from wait4)."""
    oom_kills: int = 0
    """OOM kills the kernel counted in this cgroup while the cell ran."""


def classify(ended: Exit, timeout_s: float) -> Record | None:
    """The failure record of a cell process that wrote no record (None if it wrote one)."""
    if ended.wrote_record:
        return None
    stderr, code = ended.stderr, ended.code
    if code is None:
        return _failure("timeout", f"cell exceeded its {timeout_s:.0f} s timeout", stderr)
    if any(marker in stderr for marker in PEER_MARKERS):
        return _failure("peer-died", "another process of this multi-process cell died "
                                     "(no heartbeats, or gloo lost it); this one stopped "
                                     "instead of hanging", stderr)
    rss = (f"; its peak RSS was {ended.max_rss_bytes / 2**30:.2f} GiB"
           if ended.max_rss_bytes else "")
    if code == -signal.SIGKILL and ended.oom_kills:
        return _failure("oom", f"cell process was killed by the kernel's OOM killer{rss}",
                        stderr)
    if any(marker in stderr for marker in OOM_MARKERS):
        return _failure("oom", f"cell ran out of memory (exit code {code}){rss}", stderr)
    if code == -signal.SIGKILL:
        return _failure("killed", f"cell process was killed (SIGKILL from outside the "
                                  f"harness; the OOM killer leaves no count here){rss}", stderr)
    how = (f"was killed by {signal.Signals(-code).name}" if code < 0
           else f"exited with code {code}")
    fatal = _FATAL.findall(stderr)  # what XLA (or libtpu) said as it aborted
    said = f"; it said: {fatal[-1].strip()[:300]}" if fatal else ""
    return _failure("crash", f"cell process {how} without a record{said}", stderr)


_FATAL = re.compile(r"^F\d{4} [^\]]*\] (.*)$", re.MULTILINE)
"""A glog FATAL line (XLA's and libtpu's CHECK failures): 'F1202 06:11:09.35 ... file.cc:123]
Check failed: ...'."""


def _wait(proc: subprocess.Popen, timeout_s: float) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS bytes): waits with wait4 for its rusage."""
    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_maxrss * 1024  # KiB on Linux
        if time.monotonic() >= deadline:
            return None, None
        raise_if_signalled()  # a stop that landed in another thread (harness.pool)
        time.sleep(0.05)


def run_one(cell: CellRun, env: dict[str, str], timeout_s: float,
            cwd: Path | None = None, zygote: Zygote | None = None) -> Record:
    """Runs `cell` in a fresh process; never raises for what happens inside the cell.

    The process is a fresh interpreter, or a child forked from `zygote` (its arm's packages
    imported once, nothing else: harness.zygote). Either way the worker has its own process
    group (a timeout kills the cell and anything it started) and dies with this process
    (harness.reaper): SIGKILL of the parent included, no worker runs on and no temp dir
    stays behind.
    """
    with tempfile.TemporaryDirectory(prefix="parity-cell-") as tmp, \
            REAPER.watch("path", path=tmp):
        out = Path(tmp) / "record.json"
        err_path = Path(tmp) / "stderr.txt"
        start = time.perf_counter()
        oom_before = _oom_kills()
        try:
            if zygote is not None and zygote.ready:
                code, max_rss = _forked(zygote, cell, env, out, err_path, timeout_s)
            else:
                code, max_rss = _executed(cell, env, out, err_path, timeout_s, cwd)
            lost = None
        except ZygoteError as err:
            code, max_rss, lost = None, None, err
        oom_after = _oom_kills()
        stderr = err_path.read_text(errors="replace") if err_path.exists() else ""
        ended = Exit(code=code, stderr=stderr, wrote_record=out.exists(),
                     max_rss_bytes=max_rss,
                     oom_kills=(oom_after - oom_before) if oom_before is not None
                     and oom_after is not None else 0)
        elapsed = time.perf_counter() - start
        record = (_failure("crash", f"the zygote forking {cell.arm}'s workers {lost}", stderr)
                  if lost and not ended.wrote_record else classify(ended, timeout_s))
        if record is None:
            record = Record.from_json(json.loads(out.read_text()), f"cell {cell.arm}",
                                      whole=False)
            if record.error:
                record.error.stderr_tail = ended.stderr[-STDERR_TAIL:]
    record.wall_s = elapsed
    return record


def cell_json(cell: CellRun) -> str:
    """`cell` as the worker's --cell JSON: the fields that differ from their defaults, so a
    worker of an older commit (an A/B side) that lacks a newer field still reads it."""
    defaults = {f.name: f.default for f in dataclasses.fields(CellRun)}
    data = dataclasses.asdict(cell)
    return json.dumps({k: v for k, v in data.items()
                       if k not in defaults or defaults[k] is dataclasses.MISSING
                       or v != defaults[k]})


def _executed(cell: CellRun, env: dict[str, str], out: Path, err_path: Path,
              timeout_s: float, cwd: Path | None) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS) of `python -m harness.worker`."""
    return worker_process(["--cell", cell_json(cell), "--out", str(out)], env, err_path,
                          timeout_s, cwd)


def worker_process(args: list[str], env: dict[str, str], err_path: Path, timeout_s: float,
                   cwd: Path | None) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS) of `python -m harness.worker ARGS` in a
    process group of its own that dies with this process; its output goes to `err_path`."""
    with started_worker(args, env, err_path, cwd) as proc:
        return _wait(proc, timeout_s)


@contextlib.contextmanager
def started_worker(args: list[str], env: dict[str, str], err_path: Path, cwd: Path | None,
                   pass_fds: Sequence[int] = ()):
    """Yields the Popen of `python -m harness.worker ARGS`, started in a process group of
    its own that dies with this process, its output going to `err_path`, `pass_fds` kept
    open in it; on leaving (the worker's end, a timeout, SIGINT or SIGTERM) the group is
    taken down and the process reaped."""
    command = [sys.executable, "-m", "harness.worker", *args]
    env = {**env, SPAWNED_AT: repr(time.time())}
    parent = os.getpid()

    def child_setup() -> None:  # the worker starts with the stops unblocked again
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
        die_with_parent(parent)()

    with err_path.open("w") as stderr:
        # A stop (SIGTERM, SIGINT, SIGHUP) that arrived between the fork and the cleanup's
        # registration would leave the worker running while the parent removes the temp dirs
        # it writes into: stops are held until the worker is registered, then land inside.
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
        try:
            proc = subprocess.Popen(command, env=env, stdout=stderr, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=cwd, pass_fds=tuple(pass_fds),
                                    preexec_fn=child_setup)
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            raise
        try:
            with REAPER.watch("group", pgid=proc.pid):
                signal.pthread_sigmask(signal.SIG_SETMASK, held)
                yield proc
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            if proc.returncode is None:
                proc.wait()


_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
"""The signals that stop a run (harness.reaper.terminate_on_signals)."""


def _forked(zygote: Zygote, cell: CellRun, env: dict[str, str], out: Path, err_path: Path,
            timeout_s: float) -> tuple[int | None, int | None]:
    """(exit code or None at the timeout, peak RSS) of a worker forked from `zygote`; `env`
    adds to the zygote's only what differs from it."""
    extra = {k: v for k, v in env.items() if zygote.env.get(k) != v}
    pid = zygote.spawn(cell_json(cell), out, err_path,
                       {**extra, SPAWNED_AT: repr(time.time())})
    finished = False
    with REAPER.watch("group", pgid=pid):
        try:
            code, max_rss = zygote.wait(timeout_s)
            finished = code is not None
        finally:  # the timeout, SIGINT or SIGTERM: take the cell's group down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if not finished:
                code, max_rss = zygote.reap(pid)
    return (code if finished else None), max_rss


def schedule(cells: Sequence[CellRun], rounds: int) -> list[tuple[int, int, CellRun]]:
    """(round, cell index, cell) in run order: every cell once per round, the order reversed
    on odd rounds (A B C, C B A, ...) so slow drift of the machine reaches every cell alike.
    Only round 0 traces and checks parity (deterministic work; later rounds only time)."""
    if rounds < 1:
        raise ValueError(f"--rounds {rounds}: give at least 1 round")
    order = []
    for round_index in range(rounds):
        indices = range(len(cells)) if round_index % 2 == 0 else reversed(range(len(cells)))
        for index in indices:
            cell = cells[index]
            if round_index:
                cell = dataclasses.replace(cell, trace=False, parity=False)
            order.append((round_index, index, cell))
    return order


_issued: set[str] = set()


def new_run_id(prefix: str = "") -> str:
    """A timestamp to the microsecond and this process's id, so two runs started at the
    same moment on one host differ; within a process, an id never repeats."""
    while True:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        run_id = f"{prefix}{now}-p{os.getpid()}"
        if run_id not in _issued:
            _issued.add(run_id)
            return run_id


def run_grid(cells: Sequence[CellRun], out_dir: str | Path, *, env: dict[str, str],
             timeout_s: float, run_id: str | None = None, suite: str | None = None,
             rounds: int = 1, on_record: Callable[[int, Record], None] | None = None,
             on_start: Callable[[CellRun, int], None] | None = None,
             cwd: Path | None = None, ab: ABTag | None = None,
             environment: dict | None = None, distributed: dict | None = None,
             first_round: int = 0, store: Path | None = None,
             prefork: bool = True, jobs: int = 1,
             alongside: Callable[[], None] | None = None) -> tuple[Path, list[Record]]:
    """Runs every cell `rounds` times (interleaved, see `schedule`), appending each record to
    `out_dir/<run_id>.jsonl` as it finishes; returns the records in run order.

    `cwd` is where cells run (an A/B worktree); `ab` tags every record with its A/B side
    and `first_round` numbers its rounds; `environment` stands in for cells that died before
    writing their own. With `distributed` ({"coordinator": "HOST:PORT", "num_processes",
    "process_id"}) this is one host's runner: the k-th process of the run meets at PORT + k,
    and only process 0 writes records. `store` is where cells share what is the same for
    them (`cell_store`); None: a temp dir for the duration of this call. With `prefork`,
    each arm's workers are forked from a zygote that imported its packages once
    (harness.zygote); without, each is a fresh interpreter (an A/B ref's own worker).
    `alongside` runs once the zygotes have started importing, and the first cell only after
    it returned: work that may share the machine with imports, never with a cell (`parity
    run --selftest`); what it raises ends the run before any cell. `jobs` > 1 runs that
    many plan cells side by side (harness.pool; timed cells always run alone); the file
    then holds records in the order the cells ended, and the returned list is in run order.
    """
    run_id = run_id or new_run_id()
    path = results_path(out_dir, run_id, suite)
    if jobs > 1 and not all(c.plan_target for c in cells):
        raise ValueError(f"--jobs {jobs}: only plans run side by side; a timed cell runs "
                         "alone (its figures would measure the other cells too)")
    finished: list[tuple[int, Record]] = []
    writer = distributed is None or distributed.get("process_id", 0) == 0
    done = recorded(path, run_id)
    order = [(r, i, c) for r, i, c in schedule(cells, rounds)
             if (c.arm, _config_hash(c), first_round + r) not in done]
    one_at_a_time = threading.Lock()  # the results file, the callbacks, the zygotes' table

    def run(k: int, item: tuple[int, int, CellRun]) -> None:
        round_index, index, cell = item
        raise_if_signalled()
        if distributed:
            cell = dataclasses.replace(cell, distributed=_cell_distributed(distributed, k))
        if cell.trace:
            cell = dataclasses.replace(cell, trace_session=trace_session(
                run_id, cell, first_round + round_index))
        with one_at_a_time:
            if on_start:
                on_start(cell, first_round + round_index)
            zygote = zygotes.get(cell)
        record = run_one(cell, {**env, **cell_store(store, cell)}, timeout_s, cwd, zygote)
        if zygote is not None and zygote.forked == 1 and record.phases is not None:
            record.phases = {"preload": zygote.ready_s, **record.phases}
        stamp(record, cell, run_id=run_id, suite=suite, round_index=first_round + round_index,
              env=env, environment=environment, ab=ab)
        with one_at_a_time:
            if writer:
                try:
                    results.append(path, record)
                except results.WriteError as err:
                    lost = cell_name(cell.arm, record.spec) + f" round {record.round}"
                    raise results.WriteError(
                        f"{err}. Lost: the record of {lost}; {len(finished)} earlier records "
                        f"are kept, {len(order) - len(finished) - 1} cells did not run. Free "
                        f"space, then run the same command with --run-id {run_id}: it skips "
                        "the cells recorded under that id and appends the rest"
                    ) from err
            finished.append((k, record))
            if on_record:
                on_record(index, record)

    with results.exclusive(path) if writer else contextlib.nullcontext(), \
            _store(store) as store, \
            _Zygotes(store, env, cwd, cells if prefork else None, alongside) as zygotes:
        if jobs > 1:  # one arm's cells one at a time: its zygote forks one worker at once
            run_keyed(order, jobs, lambda item: _key(item[2]), run)
        else:
            for k, item in enumerate(order):
                run(k, item)
    return path, [record for _, record in sorted(finished, key=lambda pair: pair[0])]


def stamp(record: Record, cell: CellRun, *, run_id: str, suite: str | None, round_index: int,
          env: dict[str, str], environment: dict | None, ab: ABTag | None = None) -> None:
    """Fills in what the runner knows of a cell's record: ids, spec, options, time, and the
    environment where the worker died before writing its own."""
    record.run_id, record.suite, record.arm = run_id, suite, cell.arm
    record.round = round_index
    record.spec = section(Spec, cell.spec)
    record.config_hash = _config_hash(cell)
    record.run = RunOptions(steps=cell.steps, warmup=cell.warmup, trace=cell.trace,
                            trace_steps=cell.trace_steps, parity=cell.parity,
                            trace_hlo=cell.trace_hlo, plan_target=cell.plan_target,
                            plan_slices=cell.plan_slices, plan_libtpu=cell.plan_libtpu)
    record.timestamp = datetime.datetime.now(datetime.UTC).isoformat()
    record.ab = ab
    if record.environment is None and environment is not None:
        record.environment = section(Environment, environment)
    if record.environment is not None:
        # The runner chose the cell's allocator, so the runner records it (also for an A/B
        # ref whose worker predates the field).
        record.environment.host_malloc = host_malloc(env)


def recorded(path: Path, run_id: str) -> set[tuple]:
    """(arm, config hash, round) of every cell `path` already holds a record of under
    `run_id`: a run resumed with the same --run-id skips them."""
    if not path.exists():
        return set()
    return {(r.arm, r.config_hash, r.round) for r in results.read(path) if r.run_id == run_id}


class _Zygotes:
    """The zygotes of one grid, one per arm (and plugins). All start together when the grid
    does, and the first cell runs once every one has imported (no import competes with a
    timed window; 2 cores import two at a time); they end with the grid. A zygote whose
    imports failed stays, not ready, so its arm's cells run the plain way (and record the
    failure); one that died is started again at its arm's next cell. `alongside` runs while
    they import."""

    def __init__(self, store: Path, env: dict[str, str], cwd: Path | None,
                 cells: Sequence[CellRun] | None, alongside: Callable[[], None] | None = None):
        self.store, self.env, self.cwd = store, env, cwd
        self.live: dict[tuple, Zygote] = {}
        try:
            for cell in cells or ():
                if _key(cell) not in self.live:
                    self.live[_key(cell)] = self._new(cell)
            if alongside is not None:
                alongside()
            for zygote in self.live.values():
                zygote.start()
        except BaseException:  # a stop while they import: none is left behind
            self.__exit__()
            raise

    def _new(self, cell: CellRun) -> Zygote:
        log = self.store / f"zygote-{_path_safe(cell.arm)}-{len(self.live)}.log"
        return Zygote(cell.arm, tuple(cell.plugins), self.env, log, self.cwd)

    def get(self, cell: CellRun) -> Zygote | None:
        zygote = self.live.get(_key(cell))
        if zygote is None:
            return None
        if zygote.error is None and not zygote.ready:  # it died: a new one for this cell
            zygote.close()
            zygote = self.live[_key(cell)] = self._new(cell).start()
        return zygote

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for zygote in self.live.values():
            zygote.close()


def _key(cell: CellRun) -> tuple:
    return cell.arm, tuple(cell.plugins)


@contextlib.contextmanager
def _store(store: Path | None):
    """`store`, or a fresh temp dir (removed afterwards, and by the reaper if this process
    is killed)."""
    if store is not None:
        yield Path(store)
        return
    with tempfile.TemporaryDirectory(prefix="parity-store-") as tmp, \
            REAPER.watch("path", path=tmp):
        yield Path(tmp)


def cell_store(store: Path, cell: CellRun) -> dict[str, str]:
    """The variables that point a cell at what it shares with other cells of the run:
    - the persistent compilation cache of its arm, shared by every cell of that arm (its
      rounds, and its other shapes), so a program the arm compiled earlier in the run loads
      instead of compiling again: every program of a later round, and of another shape what
      does not depend on the shape (the model's initializer; the update, which does not
      depend on GA). A cache is per arm, so no arm loads what another compiled; the record
      counts the hits (Timing.compile_cache_hits);
    - the exact reference gradients, one per spec (every arm of a shape is given the same
      work), computed by the first cell of the shape that checks parity and read by the
      others (Parity.reference_shared).
    """
    return {COMPILE_CACHE: str(store / "compile" / _path_safe(cell.arm)),
            REFERENCE_DIR: str(store / "reference")}


def check_run_id(run_id: str) -> None:
    """A run id names a results file inside --out: one plain file name. A separator or '..'
    would write outside --out (or below it, where no reader looks)."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id:
        raise ValueError(f"--run-id {run_id!r}: give a plain name (no '/', not '..'); the "
                         "results file is <out>/<run id>.jsonl, and --out chooses where")


def results_path(out_dir: str | Path, run_id: str, suite: str | None = None) -> Path:
    """The results file of run `run_id` (one JSON record per line)."""
    return Path(out_dir) / f"{run_id}{'-' + suite if suite else ''}.jsonl"


def trace_session(run_id: str, cell: CellRun, round_index: int = 0) -> str:
    """Where a cell's capture goes below the trace root:
    '<run id>/<arm>-<preset>-s<seq>-b<batch>-ga<ga>', with '-r<round>' for a round other than 0
    (only round 0 traces today).
    The grid varies only these keys within a run, so the name tells the cells apart; a cell
    listed twice gets '-2' from the capture (harness.trace.claim_directory)."""
    spec = cell.spec
    name = f"{cell.arm}-{spec['preset']}-s{spec['seq']}-b{spec['batch']}-ga{spec['ga']}"
    if round_index:
        name += f"-r{round_index}"
    return f"{_path_safe(run_id)}/{_path_safe(name)}"


def _path_safe(name: str) -> str:
    """`name` as one path component: a character that is not a letter, digit, '.', '_' or
    '-' (e.g. the ':' of an 'engine:maxtext' arm, a '/' in a run id) becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def _cell_distributed(distributed: dict, index: int) -> dict:
    if distributed.get("auto"):
        return dict(distributed)
    host, port = distributed["coordinator"].rsplit(":", 1)
    return {**distributed, "coordinator": f"{host}:{int(port) + index}"}


def _config_hash(cell: CellRun) -> str:
    from arms.spec import CellSpec

    return CellSpec.from_dict(cell.spec).config_hash()
