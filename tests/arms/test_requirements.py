"""arms.requirements: which arms an environment can run, judged by what works there (a
package installed, MaxText's model and engine importing), never by version pins; and the one
line that says why an arm cannot."""

from arms.registry import unavailable
from arms.requirements import (
    MAXTEXT_ENGINE,
    MAXTEXT_MODEL,
    Found,
    found_versions,
    import_failures,
    why_unavailable,
)

TPU_HOST = Found(versions={"python": "3.11.2", "maxtext": None, "jax": "0.10.2",
                           "flax": "0.12.8", "google-tunix": "0.1.7"})
"""A TPU v5e VM image with the offline install and no MaxText wheels (docs/install.md)."""
TPU_HOST_MAXTEXT = Found(versions={**TPU_HOST.versions, "maxtext": "0.2.5"},
                         imports={MAXTEXT_MODEL: None, MAXTEXT_ENGINE: None})
"""The same host with MaxText's wheels: Python 3.11 and jax 0.10.2, which maxtext 0.2.5's
metadata excludes, and MaxText's model and engine importing through the shims."""
LOCK = Found(versions={"python": "3.12.1", "maxtext": "0.2.5", "jax": "0.11.2",
                       "flax": "0.12.12", "google-tunix": "0.1.7"},
             imports={MAXTEXT_MODEL: None, MAXTEXT_ENGINE: None})


def test_the_maxtext_arms_name_what_they_lack_on_a_host_without_maxtext():
    why = unavailable("maxtext-engine", TPU_HOST)
    assert why == "maxtext not installed (>=0.2.5 needed)"
    assert unavailable("peft-maxtext", TPU_HOST) == why
    assert unavailable("engine:maxtext", TPU_HOST) == why  # any pair on MaxText's model
    for arm in ("engine", "engine-fused", "native", "peft-decoder", "peft-tunix"):
        assert unavailable(arm, TPU_HOST) is None, arm


def test_python_and_jax_versions_do_not_decide_where_maxtext_imports():
    """maxtext 0.2.5 declares Python >= 3.12 and jax >= 0.11.2; on the v5e host's 3.11 /
    0.10.2 its model and engine import (through the shims), so every arm runs."""
    for arm in ("peft-maxtext", "maxtext-engine", "engine:maxtext", "native"):
        assert unavailable(arm, TPU_HOST_MAXTEXT) is None, arm


def test_an_import_that_fails_is_the_reason_the_arms_that_need_it_give():
    model_fails = Found(versions=TPU_HOST_MAXTEXT.versions, imports={
        MAXTEXT_MODEL: "ImportError: No module named 'omegaconf'", MAXTEXT_ENGINE: "(same)"})
    assert unavailable("peft-maxtext", model_fails) == (
        "MaxText's model does not import here: ImportError: No module named 'omegaconf'")
    assert unavailable("maxtext-engine", model_fails) == unavailable("peft-maxtext",
                                                                     model_fails)
    engine_fails = Found(versions=TPU_HOST_MAXTEXT.versions, imports={
        MAXTEXT_MODEL: None, MAXTEXT_ENGINE: "ImportError: No module named 'tunix.sft'"})
    assert unavailable("peft-maxtext", engine_fails) is None  # the model alone imports
    assert unavailable("maxtext-engine", engine_fails) == (
        "MaxText's training engine does not import here: ImportError: No module named "
        "'tunix.sft'")
    assert unavailable("peft-tunix", engine_fails) is None


def test_on_the_lock_every_arm_runs_and_tunix_arms_need_tunix():
    for arm in ("engine", "native", "peft-decoder", "peft-tunix", "peft-maxtext",
                "maxtext-engine", "engine:tunix"):
        assert unavailable(arm, LOCK) is None, arm
    no_tunix = Found(versions={**LOCK.versions, "google-tunix": None}, imports=LOCK.imports)
    assert why_unavailable("peft", "decoder", no_tunix) == (
        "google-tunix not installed (>=0.1.7 needed)")
    assert why_unavailable("engine", "tunix", no_tunix) is not None
    assert why_unavailable("engine", "decoder", no_tunix) is None


def test_this_environment_is_read_from_metadata_and_a_child_import():
    from importlib.metadata import version

    found = found_versions()
    assert found["maxtext"] == version("maxtext")
    assert found["google-tunix"] == version("google-tunix")
    # every arm of our own decoder runs wherever the project's core stack does
    assert unavailable("native") is None and unavailable("engine") is None
    # this environment installs MaxText (the lock, and the Python 3.11 job's): its model and
    # engine import in a child interpreter, shims applied where this Python needs them
    assert import_failures() == {MAXTEXT_MODEL: None, MAXTEXT_ENGINE: None}
    assert unavailable("maxtext-engine") is None


def test_an_environments_import_check_is_kept_and_asked_again_only_when_it_changes(
        tmp_path, monkeypatch):
    """The child's answer is written once per environment key and read back after (no child
    started); another interpreter or other installed versions make another key."""
    import subprocess
    import sys

    from arms import requirements

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    requirements.import_failures.cache_clear()
    first = requirements.import_failures()
    (kept,) = (tmp_path / "parity" / "imports").glob("*.json")
    assert kept.stem == requirements.environment_key()

    def no_child(*args, **kwargs):
        raise AssertionError("the import check ran again in an unchanged environment")

    monkeypatch.setattr(subprocess, "run", no_child)
    requirements.import_failures.cache_clear()
    assert requirements.import_failures() == first
    monkeypatch.setattr(sys, "executable", sys.executable + "-another")
    assert requirements.environment_key() != kept.stem
    requirements.import_failures.cache_clear()
