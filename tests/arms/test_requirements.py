"""arms.requirements: which arms an environment can run, judged from package versions, and
the one line that names each package, the version found and the one needed."""

from arms.registry import unavailable
from arms.requirements import found_versions, why_unavailable

TPU_HOST = {"python": "3.11.7", "maxtext": None, "jax": "0.10.2", "flax": "0.12.8",
            "google-tunix": "0.1.7"}
"""The package versions of a TPU v5e VM image with the offline install (docs/install.md)."""
LOCK = {"python": "3.12.1", "maxtext": "0.2.5", "jax": "0.11.2", "flax": "0.12.12",
        "google-tunix": "0.1.7"}


def test_the_maxtext_arms_name_every_package_they_lack_on_a_tpu_vm_image():
    why = unavailable("maxtext-engine", TPU_HOST)
    assert why == ("Python 3.11.7 found, >=3.12 needed; maxtext not installed (>=0.2.5 "
                   "needed); jax 0.10.2 found, >=0.11.2 needed; flax 0.12.8 found, >=0.12.12 "
                   "needed")
    assert unavailable("peft-maxtext", TPU_HOST) == why
    assert unavailable("engine:maxtext", TPU_HOST) == why  # any pair on MaxText's model
    for arm in ("engine", "engine-fused", "native", "peft-decoder", "peft-tunix"):
        assert unavailable(arm, TPU_HOST) is None, arm


def test_on_the_lock_every_arm_runs_and_tunix_arms_need_tunix():
    for arm in ("engine", "native", "peft-decoder", "peft-tunix", "peft-maxtext",
                "maxtext-engine", "engine:tunix"):
        assert unavailable(arm, LOCK) is None, arm
    no_tunix = {**LOCK, "google-tunix": None}
    assert why_unavailable("peft", "decoder", no_tunix) == (
        "google-tunix not installed (>=0.1.7 needed)")
    assert why_unavailable("engine", "tunix", no_tunix) is not None
    assert why_unavailable("engine", "decoder", no_tunix) is None


def test_this_environment_is_read_from_package_metadata():
    from importlib.metadata import version

    found = found_versions()
    assert found["jax"] == version("jax") and found["flax"] == version("flax")
    # every arm of our own decoder runs wherever the project's core stack does
    assert unavailable("native") is None and unavailable("engine") is None
