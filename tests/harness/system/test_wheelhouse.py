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


def _wheel(path: Path) -> Path:
    """A wheel of package `demo`: a module and data under demo/assets/ (what --slim drops)."""
    import zipfile

    files = {"demo/__init__.py": "VALUE = 3\n", "demo/assets/big.bin": "x" * 4096,
             "demo/assets/sub/vocab.txt": "a b c\n",
             "demo-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
             "demo-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                         "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},,\n" for name in files) + "demo-1.0.dist-info/RECORD,,\n"
    wheel = path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for name, text in {**files, "demo-1.0.dist-info/RECORD": record}.items():
            out.writestr(name, text)
    return wheel


def test_a_slimmed_wheel_leaves_out_its_data_and_installs_and_imports(tmp_path):
    import subprocess
    import sys
    import zipfile

    from harness.system.wheelhouse import slim

    wheel = _wheel(tmp_path)
    assert slim(wheel, ("demo/assets/",)) > 0
    with zipfile.ZipFile(wheel) as kept:
        names = kept.namelist()
        record = kept.read("demo-1.0.dist-info/RECORD").decode()
    assert not [n for n in names if n.startswith("demo/assets/")]
    assert "demo/__init__.py" in names and "demo/assets" not in record
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--target", str(target), str(wheel)], check=True)
    done = subprocess.run([sys.executable, "-c", "import demo; print(demo.VALUE)"],
                          env={"PYTHONPATH": str(target)}, capture_output=True, text=True)
    assert done.stdout.strip() == "3", done.stderr
    import pytest

    with pytest.raises(ValueError, match=r"demo/__init__\.py is code, not data"):
        slim(wheel, ("demo/",))


def test_what_is_left_out_of_maxtext_s_wheel_is_data():
    """SLIM's directories of the installed maxtext hold no module: what the carried wheel
    lacks is its tokenizer files, which only MaxText's text input pipeline reads."""
    import importlib.util

    from harness.system.wheelhouse import SLIM

    spec = importlib.util.find_spec("maxtext")  # installed on both tested stacks
    root = Path(spec.submodule_search_locations[0]).parent
    for directory in SLIM["maxtext"]:
        files = [p for p in (root / directory).rglob("*") if p.is_file()]
        assert files, directory
        assert not [p for p in files if p.suffix in (".py", ".so")], directory
