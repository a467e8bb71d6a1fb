"""The versions records are compared by: libtpu joins them only where it is installed."""

import importlib.metadata

from harness.system import environment


def test_libtpu_is_recorded_where_installed_and_left_out_where_not(monkeypatch):
    real = importlib.metadata.version

    def absent(name):
        if name == "libtpu":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    without = environment.versions()
    assert "libtpu" not in without  # CPU/GPU records keep the keys they always had
    assert set(without) == set(environment.PACKAGES)
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "0.0.32" if name == "libtpu" else real(name))
    with_tpu = environment.versions()
    assert with_tpu == {**without, "libtpu": "0.0.32"}
