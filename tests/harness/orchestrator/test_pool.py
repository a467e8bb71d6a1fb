"""harness.orchestrator.pool: plan cells side by side, one key at a time."""

import threading

import pytest

from harness.orchestrator.pool import run_keyed


def test_items_of_one_key_wait_for_each_other_and_others_run_beside_them():
    log, lock, beside = [], threading.Lock(), threading.Event()

    def work(index, item):
        _, name = item
        with lock:
            log.append(("start", name))
        if name == "b1":
            beside.set()
        if name == "a1":  # b1 starts while a1 runs, or a1 fails
            assert beside.wait(60), "b1 did not run beside a1"
        with lock:
            log.append(("end", name))

    run_keyed([("a", "a1"), ("a", "a2"), ("b", "b1")], 2, key=lambda it: it[0], work=work)
    assert len(log) == 6
    assert log.index(("end", "a1")) < log.index(("start", "a2"))  # one key at a time
    assert log.index(("start", "b1")) < log.index(("end", "a1"))  # two keys side by side


def test_one_job_runs_every_item_in_order_with_its_index():
    seen = []
    run_keyed(["x", "y", "z"], 1, key=lambda it: it, work=lambda i, it: seen.append((i, it)))
    assert seen == [(0, "x"), (1, "y"), (2, "z")]


def test_a_failure_is_raised_and_starts_nothing_new():
    started = []

    def work(index, item):
        started.append(item)
        if item == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_keyed([1, 2, 3, 4], 1, key=lambda it: it, work=work)
    assert started == [1]


def test_no_job_is_refused():
    with pytest.raises(ValueError, match="give at least 1"):
        run_keyed([1], 0, key=lambda it: it, work=lambda i, it: None)
