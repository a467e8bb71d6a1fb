"""Test session setup: 8 emulated CPU devices, set before jax is imported anywhere."""

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import pytest


@pytest.fixture(scope="session")
def devices():
    found = jax.devices()
    assert len(found) == 8, f"expected 8 emulated devices, got {len(found)}: XLA_FLAGS was ignored"
    return found
