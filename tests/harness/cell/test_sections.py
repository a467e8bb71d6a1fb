"""The cell's timed window and planned peak (harness.cell.sections)."""

import gc
import weakref

from harness.cell.phases import CompileCounter
from harness.cell.sections import planned_peak, timed_window
from harness.contract import CellRun
from reports.record import ExecutableMemory


def test_the_timed_window_starts_on_a_collected_heap(devices):
    """Cyclic garbage left by build and warmup is collected before the first timed step, so no
    arm pays the deferred full collection of its start-up objects inside its window."""
    from arms.registry import make_arm
    from arms.spec import CellSpec

    spec = CellSpec(preset="tiny", seq=16, batch=4, ga=2)
    arm = make_arm("native", spec)
    arm.build()
    batches = arm.place(spec.micro_batches(0))
    arm.step(batches)  # warmup
    gc.disable()  # only an explicit collection may free the cycle below
    try:
        cycle = []
        garbage = weakref.ref(_Cell(cycle))  # the cell and the list refer to each other
        del cycle
        assert garbage() is not None
        collected_before_step = []
        real_step = arm.step

        def step(micro_batches):
            collected_before_step.append(garbage() is None)
            return real_step(micro_batches)

        arm.step = step
        run = CellRun(arm="native", spec=spec.to_dict(), steps=3, warmup=1)
        timing, _ = timed_window(arm, batches, run, spec, CompileCounter(), build_s=0.0)
    finally:
        gc.enable()
    assert collected_before_step == [True, True, True]
    assert timing.recompiles_after_warmup == 0
    arm.close()


class _Cell:
    """A weak-referenceable object kept alive only by a reference cycle."""

    def __init__(self, cycle):
        self.cycle = cycle
        cycle.append(self)


def _executable(total: int, held: int) -> ExecutableMemory:
    return ExecutableMemory(argument=total, output=0, alias=0, temp=0, total=total, held=held)


def test_the_planned_peak_counts_held_state_and_only_executables_the_step_calls():
    """A split step's fwd/bwd (100 bytes) with the optimizer's 80 beside it outweighs its
    update (150, the whole state as arguments); a kernel compiled but not called (MaxText's
    accumulating one at GA 1) adds nothing, and neither does one with no memory analysis."""
    planned = {"fwd_bwd": _executable(100, 80), "update": _executable(150, 0),
               "fwd_bwd_accum": _executable(500, 80), "host": None}
    calls = {"fwd_bwd": 1, "update": 1, "fwd_bwd_accum": 0, "host": 1}
    assert planned_peak(planned, calls) == 180
    assert planned_peak({"update": _executable(150, 0)}, {"update": 1}) == 150
    assert planned_peak({"host": None}, {"host": 1}) is None



def test_releasing_device_memory_leaves_no_array_alive():
    """Before the gradient check, every buffer the measured arm left is freed, also one a
    cache outside the arm still holds: the check starts from an empty device. (In a process
    of its own: it deletes every array of the process.)"""
    import subprocess
    import sys

    from tests.harness.cli_helpers import cli_env

    code = ("import jax, jax.numpy as jnp\n"
            "from harness.cell.sections import release_device_memory\n"
            "held = [jnp.ones((256, 256), jnp.float32) for _ in range(3)]\n"
            "freed = release_device_memory()\n"
            "assert freed >= 3 * 256 * 256 * 4, freed\n"
            "assert jax.live_arrays() == [] and all(x.is_deleted() for x in held)\n"
            "print('released', freed)\n")
    done = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("released ")
