"""Cells side by side: a few threads, each waiting on one cell process at a time.

Only for work whose figures do not depend on what else the machine does (plans: a compile
for a TPU topology gives the same program however loaded the host is); a timed cell always
runs alone. XLA:TPU compiles one program on ~1.6 cores, so on 2 cores two plans side by side
finish in ~0.7x the time of one after the other (measured: two qwen3-1.7b seq-4096 plans,
266 s one after the other, 182 s side by side).

Two items with the same key never run at once (a zygote forks one worker at a time); other
than that, items start in the order given. A stop (SIGINT, SIGTERM) raises in the main
thread, where the threads' waits notice it (`harness.system.reaper.raise_if_signalled`) and take
their cells down; nothing new starts once one item has failed or a stop has come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def run_keyed(items: Sequence[T], jobs: int, key: Callable[[T], Hashable],
              work: Callable[[int, T], None]) -> None:
    """Calls work(index, item) for every item on `jobs` threads, never two items of one key
    at once; re-raises the first exception (a stop included) once every thread has ended."""
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: give at least 1")
    pending = list(enumerate(items))
    busy: set = set()
    failed: list[BaseException] = []
    changed = threading.Condition()

    def take() -> tuple[int, T] | None:
        with changed:
            while pending and not failed:
                free = next((i for i, (_, item) in enumerate(pending)
                             if key(item) not in busy), None)
                if free is not None:
                    index, item = pending.pop(free)
                    busy.add(key(item))
                    return index, item
                changed.wait()
            return None

    def loop() -> None:
        while (taken := take()) is not None:
            index, item = taken
            try:
                work(index, item)
            except BaseException as err:  # a stop too: the main thread re-raises it
                with changed:
                    failed.append(err)
            finally:
                with changed:
                    busy.discard(key(item))
                    changed.notify_all()

    threads = [threading.Thread(target=loop, name=f"parity-job-{n}", daemon=True)
               for n in range(min(jobs, len(items)))]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException as err:  # a stop landed here: no new item; the running ones see it
        with changed:
            failed.insert(0, err)
            changed.notify_all()
        for thread in threads:
            thread.join()
    if failed:
        raise failed[0]
