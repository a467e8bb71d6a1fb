"""harness.jobs.run: which cells start as forks of their arm's zygote."""

from harness.jobs.run import prefork_on


def test_cells_fork_from_the_zygote_on_the_cpu_backend_only():
    assert prefork_on({"backend": "cpu", "device_count": 8})
    for accelerator in ("gpu", "cuda", "tpu"):
        assert not prefork_on({"backend": accelerator, "device_count": 1})
