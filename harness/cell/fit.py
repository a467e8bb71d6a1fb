"""Whether a cell fits its device, from XLA's plan of its step for that device, before
anything of it is built.

On an accelerator a cell that cannot fit would otherwise be found only after its process
started, built its model and compiled its step (~80 s per cell on a TPU v5e host), and only
then run out of device memory. Here the cell's arm is built from shapes alone (`Arm.plan`:
nothing is allocated), the executables a step calls are compiled for this process's own
devices (on a TPU, by the libtpu the runtime loaded, the same compiler a compile-only
`v5e:1x1` target uses), and their planned peak (harness.cell.plan.summarize: the largest
executable's argument + output + temp - alias, plus the train state it leaves outside its
arguments) is held against the memory a device may use (`memory_stats()['bytes_limit']`). A
program whose own buffers exceed the device is refused by the compiler itself
(RESOURCE_EXHAUSTED, "the total memory required ... (X) exceeds available HBM (Y)"): that is
a does-not-fit too, at the compiler's figures.

The plan is of the very program the cell times (the trainer's own: the parity check adds
nothing to it, harness.cell.reference), made by the arm object the cell then builds
(`check_fit` takes it), and compiled with the arm's own compiler options and nothing added:
with the run's persistent compilation cache on (harness.cell.phases), the build that follows
loads what the check compiled instead of compiling it again, so a program is compiled once
per cell, and the check's own cost on a cell that fits is the abstract build and lowering.
A later round, or a rerun with the same cache, loads the check's compiles too:
`FitCheck.cached` says so, and the record's compile log (`Timing.compile_log`) names every
program compiled and whether it was loaded.

The CPU backend has no device memory limit, so the check runs there only where the cell
names one (`CellRun.fit_bytes`: the tests, or a user keeping headroom).
"""

from __future__ import annotations

import dataclasses
import time

from harness.contract import OOM_MARKERS, CellRun
from reports.record import Failure, Plan, Record

DOES_NOT_FIT = "does-not-fit"
"""The failure reason of a cell refused by its fit check."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class FitCheck:
    """A cell's plan for its device against the memory a device may use."""

    planned: int
    """The planned peak per device: the plan's, or the compiler's where it refused."""
    capacity: int
    """Bytes one device may use."""
    where: str
    """What holds the peak: the plan's peak executable, or the compiler's own words."""
    plan: Plan | None
    """The plan; None where the compiler refused the program."""
    seconds: float
    """Wall time of the check: abstract build, lowering and compiles (or cache loads)."""
    cached: bool
    """Every executable of the plan was loaded from the run's compilation cache."""

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.planned <= self.capacity

    def text(self) -> str:
        """'planned 16.42 of 15.75 GiB (step; checked in 3.1 s, its compile cached)'."""
        how = "its compile cached" if self.cached else "compiled"
        return (f"planned {self.planned / 2**30:.2f} of {self.capacity / 2**30:.2f} GiB "
                f"({self.where}; checked in {self.seconds:.1f} s, {how})")

    def failure(self) -> Record:
        """The record of a cell that does not fit: why, with the plan that says so."""
        return Record(status="failed", plan=self.plan, error=Failure(
            reason=DOES_NOT_FIT, message=f"does not fit: {self.text()}"))


def device_limit(device) -> int | None:
    """The bytes `device` may use (`memory_stats()['bytes_limit']`), None where the backend
    states none (CPU)."""
    stats = device.memory_stats()
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def applies(run: CellRun, plugin: bool) -> bool:
    """Whether cell `run` gets a fit check here: on an accelerator unless turned off, on CPU
    where it names a limit; never for a `plugin` arm (its factory builds it for this
    process's devices only, with no abstract build)."""
    import jax

    if not run.fit_check or plugin:
        return False
    return run.fit_bytes is not None or jax.default_backend() != "cpu"


def check_fit(run: CellRun, choice, arm, spec, compiles) -> FitCheck | None:
    """The plan of `arm` (unbuilt; cell `run`'s, resolved as `choice`:
    arms.registry.ArmChoice) for this process's devices against the memory one may use; None
    where no check applies (`applies`) or the device states no limit. `compiles`: the
    process's compile counter (harness.cell.phases.CompileCounter), which says whether the
    compiles were loaded from the cache."""
    import jax

    from harness.xla.target import REFUSED, size_bytes

    if not applies(run, choice.plugin):
        return None
    device = jax.local_devices()[0]
    capacity = run.fit_bytes if run.fit_bytes is not None else device_limit(device)
    if capacity is None:
        return None
    start, hits = time.perf_counter(), compiles.cache_hits
    arm_plan = arm.plan()
    try:
        compiled = _compile(arm_plan)
    except Exception as err:  # the compiler's own refusal of a program too large
        refused = REFUSED.search(str(err))
        if refused is None or not any(m in str(err) for m in OOM_MARKERS):
            raise
        return FitCheck(planned=size_bytes(refused.group(1), refused.group(2)),
                        capacity=capacity, plan=None,
                        where=f"refused by the compiler: {refused.group(0)}",
                        seconds=time.perf_counter() - start, cached=False)
    plan = _summarize(arm, arm_plan, compiled, spec, capacity)
    loaded = compiles.cache_hits - hits
    return FitCheck(planned=plan.planned_peak_bytes, capacity=capacity, plan=plan,
                    where=plan.peak_executable, seconds=time.perf_counter() - start,
                    cached=bool(compiled) and loaded >= len(compiled))


def _compile(arm_plan) -> dict:
    """Each executable a step calls compiled with the arm's own options, read as a plan."""
    from harness.cell.plan import MEMORY, CompiledPlan

    compiled = {}
    for name, lowered in arm_plan.executables.items():
        if not arm_plan.calls_per_step.get(name, 0):
            continue
        began = time.perf_counter()
        executable = lowered.compile(compiler_options=arm_plan.compiler_options)
        analysis = executable.memory_analysis()
        compiled[name] = CompiledPlan(
            memory={k: int(getattr(analysis, k)) for k in MEMORY}, text=executable.as_text(),
            compile_s=time.perf_counter() - began, cached=False,
            peak_unavailable="a fit check compiles without XLA's buffer-assignment dump")
    return compiled


def _summarize(arm, arm_plan, compiled: dict, spec, capacity: int) -> Plan:
    """The record's plan section of a fit check, its target this process's devices."""
    import jax

    from harness.cell.plan import summarize
    from harness.measure.flops import model_flops_per_step
    from harness.measure.roofline import roofline
    from harness.xla.target import loaded_version, local_target

    device = jax.local_devices()[0]
    target = {"target": local_target(jax.devices()), "slices": 1,
              "device_kind": device.device_kind, "device_count": jax.device_count(),
              "libtpu": loaded_version() if jax.default_backend() == "tpu" else None,
              "hbm_capacity_bytes": capacity}
    plan = summarize(arm_plan, compiled, target=target,
                     mesh={name: int(size) for name, size in arm.mesh.shape.items()},
                     model_flops=model_flops_per_step(spec.model_config(), batch=spec.batch,
                                                      seq=spec.seq))
    plan.roofline = roofline(plan, spec.dtype)
    return plan
