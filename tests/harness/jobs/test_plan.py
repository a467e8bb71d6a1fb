"""`parity plan`'s job count: side by side only where the host has cores for two compiles."""

import os

import pytest

from harness.jobs import plan

GIB = 2**30


@pytest.mark.parametrize(("cores", "memory_gib", "jobs"),
                         [(2, 24, 1),    # this machine: one compile keeps both cores busy
                          (1, 24, 1),    # never fewer than one
                          (8, 64, 4),    # one per 2 cores
                          (16, 20, 2)])  # memory binds: 8 GiB per plan process
def test_default_jobs_is_one_compile_per_two_cores_within_memory(monkeypatch, cores,
                                                                 memory_gib, jobs):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    page = 4096
    pages = memory_gib * GIB // page
    monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PAGE_SIZE": page,
                                                     "SC_PHYS_PAGES": pages}[name])
    assert plan.default_jobs() == jobs
