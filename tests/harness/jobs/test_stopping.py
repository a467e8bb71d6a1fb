"""harness.jobs.stopping through the run loop, with an executor that makes records instead of
processes: a settled cell runs no more rounds while the others go on, its row is its last
look's, and `parity ab`'s and `parity bisect`'s outputs say how many rounds each cell ran
and why no more."""

import contextlib
import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from harness.contract import PROCESSES
from harness.grid.expand import expand
from harness.grid.options import first_look
from harness.jobs import ab
from harness.jobs.ab import ABResult, judge, side_tasks
from harness.jobs.bisect import Bisection, Step
from harness.jobs.bisect import markdown as bisect_markdown
from harness.jobs.grid import Request
from harness.jobs.stopping import Stopper
from harness.orchestrator.loop import Sink, run_tasks
from harness.store.layout import RunStore
from reports import sequential, stats
from reports.compare import FAILED, compare_sets
from reports.record import ABTag
from tests.reports.helpers import fixture_records

BUDGET = 8
SLOWER_BY = {0: 1.5, 1: 1.05}
"""B's step time over A's, by cell: 50% (settled at the first look that counts) and the
CPU's 5% minimum effect itself (no look can settle it: it runs the budget)."""


class Records:
    """An executor whose cells end at once with a record of 10 steps scattering 1% around
    10 ms (B's: times `SLOWER_BY` of its cell), from the fixture's native record."""

    def __init__(self):
        self.template = next(r for r in fixture_records(("native",)) if r.ok)
        self.ran: list[tuple[int, int, str]] = []

    def session(self, tasks):
        return contextlib.nullcontext()

    def run(self, number, task):
        return [self.record(slot) for slot in task]

    def key(self, task):
        return task

    def pairing(self, task):
        return None

    def record(self, slot):
        side = slot.sink.ab.side
        self.ran.append((slot.index, slot.round, side))
        rng = np.random.default_rng([slot.index, slot.round, side == "B"])
        scale = SLOWER_BY[slot.index] if side == "B" else 1.0
        steps = [float(x) for x in 10 * scale * (1 + rng.normal(0, 0.01, 10))]
        timing = dataclasses.replace(self.template.timing, step_ms=steps, steps=10)
        return dataclasses.replace(self.template, timing=timing, parity=None)


class FailingB(Records):
    """As Records, but B's cell 0 fails in every round (the fixture's failed record: an
    exception in its step), as a planted commit that does not import did on the chip."""

    def __init__(self):
        super().__init__()
        self.failed = next(r for r in fixture_records() if not r.ok)

    def record(self, slot):
        record = super().record(slot)
        if slot.index == 0 and slot.sink.ab.side == "B":
            return dataclasses.replace(record, status=self.failed.status,
                                       error=self.failed.error, timing=None)
        return record


def _run(tmp_path, *, early: bool, executor: Records | None = None):
    cells = expand({"preset": "tiny", "seq": [16, 32], "batch": 4, "steps": 10,
                    "warmup": 1, "arms": ["native"]})
    sinks = {side: Sink(path=tmp_path / f"ab-{side}.jsonl", run_id=f"ab-{side}",
                        store=RunStore(tmp_path), env={}, ab=ABTag(side=side, sha=side * 40))
             for side in "AB"}
    tasks = side_tasks(SimpleNamespace(cells=cells, rounds=BUDGET), sinks, lockstep=False)
    stopper = Stopper(judge(None, False), budget=BUDGET, min_rounds=first_look(PROCESSES, 5),
                      early=early)
    executor = executor or Records()
    found = run_tasks(tasks, executor, on_record=stopper.on_record, keep=stopper.keep)
    records = {side: [r for r in found if r.ab.side == side] for side in "AB"}
    rows = stopper.decided(compare_sets(records["A"], records["B"], paired=True))
    result = ABResult(records=records, rows=rows, shas={"A": "a" * 40, "B": "b" * 40},
                      stops=stopper.stops())
    return executor, result


def test_a_settled_cell_runs_no_more_rounds_while_the_others_run_their_budget(tmp_path):
    executor, result = _run(tmp_path, early=True)
    rounds = {index: sorted({r for i, r, _ in executor.ran if i == index}) for index in (0, 1)}
    assert rounds == {0: [0, 1, 2, 3], 1: list(range(BUDGET))}
    assert len((tmp_path / "ab-A.jsonl").read_text().splitlines()) == 4 + BUDGET
    assert [stop.line() for stop in result.stops] == [
        "native tiny seq=16 batch=4 ga=1: settled: slower beyond the 5% minimum effect "
        "after 4 of 8 rounds",
        "native tiny seq=32 batch=4 ga=1: budget: 8 of 8 rounds, not settled"]
    settled, budget = result.rows
    # each row is its last look's: its CI at the look's confidence, its verdict from it
    assert settled.verdict == stats.SLOWER and len(settled.new.ok) == 4
    assert settled.timing.confidence == pytest.approx(1 - sequential.spent(4 / BUDGET))
    assert budget.timing.confidence == pytest.approx(
        1 - (sequential.ALPHA - sequential.spent((BUDGET - 1) / BUDGET)))
    assert 0.95 < budget.timing.confidence < 0.96 and len(budget.new.ok) == BUDGET


def test_a_cell_whose_side_failed_its_first_round_runs_no_more_rounds(tmp_path):
    executor, result = _run(tmp_path, early=True, executor=FailingB())
    rounds = {index: sorted({r for i, r, _ in executor.ran if i == index}) for index in (0, 1)}
    assert rounds == {0: [0], 1: list(range(BUDGET))}
    assert [stop.line() for stop in result.stops] == [
        "native tiny seq=16 batch=4 ga=1: failed: B's cell failed in every round, after 1 "
        "of 8 rounds",
        "native tiny seq=32 batch=4 ga=1: budget: 8 of 8 rounds, not settled"]
    assert result.rows[0].verdict == FAILED and result.rows[0].timing is None
    # --fixed-rounds asked for the budget: the failing cell runs it too
    executor, _ = _run(tmp_path / "fixed", early=False, executor=FailingB())
    assert sorted({r for i, r, _ in executor.ran if i == 0}) == list(range(BUDGET))


def test_fixed_rounds_run_every_round_and_judge_once_at_95_percent(tmp_path):
    executor, result = _run(tmp_path, early=False)
    assert len(executor.ran) == 2 * 2 * BUDGET
    assert [stop.look.reason() for stop in result.stops] == [
        "budget: 8 of 8 rounds, no early stop asked"] * 2
    assert [row.timing.confidence for row in result.rows] == [stats.CONFIDENCE] * 2
    assert result.rows[0].verdict == stats.SLOWER


def test_the_ab_markdown_says_each_cells_rounds_and_why_it_stopped(tmp_path):
    _, result = _run(tmp_path, early=True)
    text = ab.markdown("main", "mine", result, BUDGET)
    assert "Up to 8 interleaved rounds, each cell in its own process" in text
    assert ("Rounds (a cell stops once its verdict at the minimum effect cannot change, "
            "each look's CI at a confidence raised for its share of the 5% "
            "(reports/sequential.py)):\n- native tiny seq=16 batch=4 ga=1: settled: slower "
            "beyond the 5% minimum effect after 4 of 8 rounds\n- native tiny seq=32 batch=4 "
            "ga=1: budget: 8 of 8 rounds, not settled\n") in text
    assert "| ratio [CI, 95% unless named] |" in text
    row = next(line for line in text.splitlines() if line.startswith("| native tiny seq=16"))
    level = stats.level(result.rows[0].timing)
    assert f"]{level} | slower |" in row and "| 4 / 4 |" in row, row
    _, fixed = _run(tmp_path / "fixed", early=False)
    text = ab.markdown("main", "mine", fixed, BUDGET)
    assert "\n8 interleaved rounds" in text and "Rounds (every round run (--fixed-rounds)):" \
        in text and "| ratio [95% CI] |" in text


def test_a_bisect_steps_line_and_table_say_its_rounds_and_end_with_the_verdict(tmp_path):
    _, result = _run(tmp_path, early=True)
    step = Step(number=1, sha="b" * 40, subject="make it slow", result=result)
    line = step.line()
    assert line.startswith("bbbbbbbbbb make it slow (settled: slower beyond the 5% minimum "
                           "effect after 4 of 8 rounds; budget: 8 of 8 rounds, not settled): ")
    assert line.split(": ")[-1] in (stats.SLOWER, "detected, under the 5% minimum effect")
    found = Bisection(good="a" * 40, bad="b" * 40, commits=["b" * 40], steps=[step],
                      first=None)
    text = bisect_markdown("GOOD", "BAD", found, Request(explicit={}, out=tmp_path))
    assert "| step | commit | subject | rounds | B / GOOD [CI]: verdict |" in text
    assert ("| 1 | bbbbbbbbbb | make it slow | settled: slower beyond the 5% minimum effect "
            "after 4 of 8 rounds; budget: 8 of 8 rounds, not settled | ") in text


def test_ab_and_bisect_take_fixed_rounds():
    from harness.cli import build_parser

    for command, refs in (("ab", ["HEAD", "HEAD"]), ("bisect", ["HEAD~3", "HEAD"])):
        parser = build_parser(only=command)
        assert parser.parse_args([command, *refs, "--fixed-rounds"]).fixed_rounds
        assert not parser.parse_args([command, *refs]).fixed_rounds
