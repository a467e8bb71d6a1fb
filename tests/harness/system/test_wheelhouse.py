"""harness.system.wheelhouse: an offline host installs from its own index what that index
holds, within the supported ranges, whatever versions its image was built with."""

from pathlib import Path

from packaging.requirements import Requirement

from harness.system.wheelhouse import main, split

REPO = Path(__file__).resolve().parents[3]
V5E_INDEX = "tensorstore pandas matplotlib plotly pillow fonttools kiwisolver contourpy " \
            "pyyaml cycler"
"""What the TPU v5e host's own index provides (../shared/tpu-host/README.md)."""
V5E_INDEX_HELD = {"pandas": "3.0.6", "matplotlib": "3.11.2", "plotly": "7.1.0",
                  "pillow": "12.3.0", "fonttools": "4.66.1", "tensorstore": "0.1.85"}
"""Versions that index held (2026-12-06): pillow, fonttools and tensorstore not the lock's
13.0.0, 4.68.0 and 0.1.86."""


def _lists(host_index: str = V5E_INDEX):
    return split((REPO / "requirements-py311.lock").read_text(),
                 (REPO / "pyproject.toml").read_text(),
                 ["jax", "jaxlib", "libtpu", "numpy", "scipy", "ml_dtypes", "opt_einsum"],
                 host_index.split())


def test_the_host_s_index_versions_satisfy_what_it_is_asked_for():
    _, from_index = _lists()
    asked = {Requirement(line).name: Requirement(line) for line in from_index}
    assert set(asked) == set(V5E_INDEX.split())
    for name, version in V5E_INDEX_HELD.items():
        assert asked[name].specifier.contains(version), (name, version, asked[name])
    # where pyproject.toml states a range, the index step holds to it
    assert not asked["pandas"].specifier.contains("2.2.3")
    assert not asked["matplotlib"].specifier.contains("3.10.0")


def test_the_wheels_carried_are_the_lock_s_pins_less_the_host_s_and_its_index_s():
    download, _ = _lists()
    names = {line.split("==")[0].lower() for line in download}
    assert all("==" in line for line in download)
    assert "flax" in names and "google-tunix" in names and "optax" in names
    assert not names & {"jax", "jaxlib", "numpy", "pandas", "pillow", "fonttools"}
    assert "pytest" not in names  # the lock's test-only part stays behind
    everything, nothing = _lists(host_index="")
    assert nothing == [] and len(everything) == len(download) + len(V5E_INDEX.split())


def test_a_package_the_lock_does_not_hold_is_refused(tmp_path, capsys):
    code = main(["--lock", str(REPO / "requirements-py311.lock"), "--pyproject",
                 str(REPO / "pyproject.toml"), "--host-index", "pandas torch",
                 "--out", str(tmp_path / "wheelhouse")])
    assert code == 2 and not (tmp_path / "wheelhouse").exists()
    assert "HOST_INDEX names torch, which the lock's runtime part does not hold" in (
        capsys.readouterr().err)
