"""The cell's timed window (harness.cell.sections)."""

import gc
import weakref

from harness.cell.phases import CompileCounter
from harness.cell.sections import timed_window
from harness.contract import CellRun


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
