"""Trip counts read from a loop's own HLO (XLA:TPU does not annotate them)."""

import pytest

from harness.xla.hlo import Unavailable, parse
from harness.xla.loops import trip_count

LOOP = """HloModule m

%body (p: (s32[], f32[])) -> (s32[], f32[]) {
  %p = (s32[], f32[]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[] get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %held = s32[] copy(%next)
  ROOT %out = (s32[], f32[]) tuple(%UPDATE, %x)
}

%cond (q: (s32[], f32[])) -> pred[] {
  %q = (s32[], f32[]) parameter(0)
  %j = s32[] get-tuple-element(%q), index=0
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%j, %four), direction=LT
}

ENTRY %main (a: f32[]) -> (s32[], f32[]) {
  %a = f32[] parameter(0)
  %zero = s32[] constant(0)
  %init = (s32[], f32[]) tuple(%zero, %a)
  ROOT %loop = (s32[], f32[]) while(%init), condition=%cond, body=%body
}
"""


@pytest.mark.parametrize("update", ["next", "held"])
def test_the_index_step_is_read_through_a_copy(update):
    """XLA:TPU may keep the induction variable's add behind a copy (native's micro-batch scan
    with Tunix's GRPO loss does): the step is the add's constant either way."""
    module = parse(LOOP.replace("%UPDATE", f"%{update}"))
    assert trip_count(module, module.by_name["loop"]) == 4


def test_an_index_that_does_not_step_by_a_constant_is_unavailable():
    module = parse(LOOP.replace("%UPDATE", "%i"))
    with pytest.raises(Unavailable, match="cannot be read"):
        trip_count(module, module.by_name["loop"])
