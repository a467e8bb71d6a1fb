"""harness.xla.target: a TPU's devices name the compile-only topology libtpu would give
them (what a fit check on a chip records as its plan's target)."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).parents[3]
TOPOLOGIES = ("v5e:1x1", "v5e:2x2", "v5e:2x4", "v6e:2x2", "v5p:2x2x1", "tpu7x:2x2x1")


def test_a_topologys_compile_only_devices_name_that_topology():
    """In a process of its own (libtpu loaded): each topology's devices, read back by their
    coordinates, give its name; the one-chip v5e (a v5e host's fit check) included."""
    code = ("import json; from harness.xla import target; print(json.dumps({t: [target."
            "local_target(target.topology_devices(t)), len(target.topology_devices(t))] for t "
            f"in {list(TOPOLOGIES)!r}}}))")
    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert {t: name for t, (name, _) in found.items()} == {t: t for t in TOPOLOGIES}
    assert found["v5e:1x1"][1] == 1 and found["tpu7x:2x2x1"][1] == 8  # two devices a chip


def test_a_device_that_is_not_a_tpu_is_named_by_its_kind():
    import jax

    from harness.xla.target import local_target

    assert local_target(jax.devices()) == jax.devices()[0].device_kind == "cpu"


def test_the_compilers_refusal_on_the_v5e_reads_as_needed_and_available_bytes():
    """The words XLA:TPU refused peft-decoder's batch-8 step with on the v5e chip
    (docs/results/tpu-v5e/chip-batch8.jsonl)."""
    import json
    from pathlib import Path

    from harness.xla.target import REFUSED, size_bytes

    chip = Path(__file__).resolve().parents[3] / "docs/results/tpu-v5e/chip-batch8.jsonl"
    (message,) = [json.loads(line)["error"]["message"] for line in chip.open()
                  if '"peft-decoder"' in line]
    found = REFUSED.search(message)
    assert found.group(0) == ("memory required for HLO temporaries (16.30G) exceeds "
                              "available HBM (15.75G)")
    assert size_bytes(*found.group(1, 2)) == int(16.30 * 2**30)
    assert size_bytes(*found.group(3, 4)) == int(15.75 * 2**30)
