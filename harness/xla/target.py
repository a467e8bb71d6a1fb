"""The plan's target: a TPU topology's compile-only devices, from libtpu, on any machine.

libtpu compiles for a named TPU topology ("tpu7x:2x2x1") through compile-only devices: no
chip is needed, so the optimized HLO, cost analysis and memory plan of a program on a TPU7x
can be read on a laptop or in CI. `make` installs libtpu outside the import path
(`.venv/libtpu`): importable, it makes JAX look for TPU chips, and print that it found none,
in every process. This module loads it when asked, after JAX's own backends are up.
Loaded, it also changes the process's profiler: trace captures taken afterwards carry
the HLO of every program. Plan in a process that does not also trace.

Only one process at a time may load libtpu: it holds a POSIX lock on `/tmp/libtpu_lockfile`
while loaded (unless ALLOW_MULTIPLE_LIBTPU_LOAD is set), and a second process fails with an
error that suggests removing the file. `check_libtpu` says which process holds it, before
anything is compiled.

`python -m harness.xla.target TOPOLOGY [SLICES]` prints one JSON line describing the target
(`describe`): the probe `parity plan` runs once before any cell.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import re
import struct
import sys
import warnings
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

LIBTPU_ENV = "PARITY_LIBTPU"
"""Environment variable naming libtpu.so; default: where `make` installs it."""

DEFAULT_LIBTPU = Path(sys.prefix) / "libtpu" / "libtpu" / "libtpu.so"
"""`.venv/libtpu/libtpu/libtpu.so`: `pip install --target .venv/libtpu` of the pinned wheel."""

TPU7X = "tpu7x:2x2x1"
"""The nightly target: one TPU7x host (4 chips, 8 devices)."""

GENERATIONS = ("v4", "v5e", "v5p", "v6e", "tpu7x")
"""TPU generations libtpu names topologies of ("v5e:2x2", "v5p:2x2x1", "tpu7x:2x2x1")."""

DEFAULT_HOST_CHIPS = (2, 2, 1)
"""The chips of one host, as libtpu lays a topology out by default."""

LOCKFILE = Path("/tmp/libtpu_lockfile")
MULTIPLE_LOAD_ENV = "ALLOW_MULTIPLE_LIBTPU_LOAD"


def libtpu_path() -> Path:
    path = Path(os.environ.get(LIBTPU_ENV) or DEFAULT_LIBTPU)
    if not path.is_file():
        raise FileNotFoundError(
            f"libtpu not found at {path}: run `make test` (it installs the pinned libtpu into "
            f".venv/libtpu), or set {LIBTPU_ENV} to a libtpu.so")
    return path


def libtpu_version() -> str | None:
    """The installed libtpu wheel's version (from its dist-info beside the library)."""
    root = libtpu_path().parent.parent
    found = sorted(root.glob("libtpu-*.dist-info"))
    return found[-1].name.removeprefix("libtpu-").removesuffix(".dist-info") if found else None


def check_topology(name: str, slices: int = 1) -> None:
    """Refuses (ValueError) a topology that is not GENERATION:AxB[xC], or no slices; whether
    libtpu knows that layout is its to say (`describe`)."""
    generation, _, layout = name.partition(":")
    if generation not in GENERATIONS or not re.fullmatch(r"\d+x\d+(x\d+)?", layout):
        raise ValueError(f"--target {name!r}: give a TPU topology GENERATION:AxB[xC] with "
                         f"GENERATION one of {', '.join(GENERATIONS)} (e.g. {TPU7X}, v5e:2x2, "
                         "v5p:2x2x1, v6e:2x2)")
    if slices < 1:
        raise ValueError(f"--target-slices {slices}: give at least 1 slice")


def libtpu_holder() -> int | None:
    """The pid of the process holding libtpu's lock, or None where it is free (or where
    ALLOW_MULTIPLE_LIBTPU_LOAD lets several processes load it)."""
    if os.environ.get(MULTIPLE_LOAD_ENV) or not LOCKFILE.exists():
        return None
    try:
        fd = os.open(LOCKFILE, os.O_RDONLY)
    except OSError:
        return None
    try:  # F_GETLK: who holds a write lock on the whole file (l_pid), without taking it
        query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        kind, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(fd, fcntl.F_GETLK, query))
    except OSError:
        return None
    finally:
        os.close(fd)
    return pid if kind != fcntl.F_UNLCK else None


def check_libtpu() -> None:
    """Refuses (ValueError) to plan where libtpu is missing or another process holds it."""
    try:
        libtpu_path()
    except FileNotFoundError as err:
        raise ValueError(str(err)) from None
    holder = libtpu_holder()
    if holder is not None:
        raise ValueError(f"libtpu is loaded by another process (pid {holder}; it holds "
                         f"{LOCKFILE}): only one process at a time may load it. Wait for "
                         f"it, or set {MULTIPLE_LOAD_ENV}=1 if you know both can")


@functools.cache
def topology_devices(name: str = TPU7X, slices: int = 1) -> tuple[jax.Device, ...]:
    """The compile-only devices of TPU topology `name` (e.g. "tpu7x:2x2x1", "v5e:2x2"),
    `slices` times over."""
    jax.devices()  # this process's own backends first: the TPU plugin must not become one
    os.environ["TPU_LIBRARY_PATH"] = str(libtpu_path())  # the pinned compiler, not a runtime's
    from jax.experimental import topologies

    try:
        found = topologies.get_topology_desc(topology_name=name, platform="tpu",
                                             num_slices=slices)
    except Exception as err:  # JaxRuntimeError: a layout smaller than one host's chips
        chips = [*(int(n) for n in name.partition(":")[2].split("x")), 1, 1][:3]
        if "chips_per_host_bounds" not in str(err) or any(
                n > host for n, host in zip(chips, DEFAULT_HOST_CHIPS, strict=True)):
            raise
        # Older libtpus (0.0.42, jax 0.10.2's) lay a topology out on hosts of 2x2x1 chips
        # unless told otherwise, and refuse one smaller than a host (v5e:1x1): such a
        # topology is one host holding all of its chips.
        found = topologies.get_topology_desc(topology_name=name, platform="tpu",
                                             num_slices=slices, chips_per_host_bounds=chips)
    return tuple(found.devices)


def mesh_like(mesh: Mesh, devices) -> Mesh:
    """A mesh of `mesh`'s shape and axis names over the first `mesh.size` of `devices`."""
    if len(devices) < mesh.size:
        raise ValueError(f"the mesh {dict(mesh.shape)} needs {mesh.size} devices; the target "
                         f"has {len(devices)}")
    return Mesh(np.array(devices[:mesh.size]).reshape(mesh.devices.shape), mesh.axis_names)


def compile_plan(lowered: jax.stages.Lowered,
                 options: dict | None = None) -> jax.stages.Compiled:
    """Compiles `lowered` (lowered for compile-only devices) with XLA `options`. JAX's
    persistent compilation cache stores the plan but cannot load a compile-only executable
    back: on a hit it warns and compiles again, which is the plan wanted, so that warning is
    dropped here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Error reading persistent compilation cache entry")
        return lowered.compile(compiler_options=options)


_SIZE = r"\(([0-9.]+)([KMGT])\)"
_AVAILABLE = re.compile(rf"exceeds available HBM {_SIZE}")
REFUSED = re.compile(rf"memory required for .*?{_SIZE} exceeds available HBM {_SIZE}")
"""XLA:TPU's refusal of a program too large for a device: the bytes it needs (groups 1-2)
and those available (3-4), each as the compiler writes it ("16.30", "G")."""
_UNIT = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def size_bytes(number: str, unit: str) -> int:
    """A size as XLA's messages write it ("15.75", "G") in bytes."""
    return int(float(number) * _UNIT[unit])


def available_hbm(device: jax.Device) -> int | None:
    """The HBM one device may use, as XLA:TPU's own buffer assignment states it: a program
    that cannot fit (its temp far above any HBM) is compiled for `device`, and the
    compiler's RESOURCE_EXHAUSTED names what is available ("exceeds available HBM
    (94.74G)"), to its two decimals. None where the message says no figure."""
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    one = NamedSharding(Mesh(np.array([device]), ("one",)), PartitionSpec())
    huge = jax.ShapeDtypeStruct((2**44,), jnp.int8, sharding=one)
    try:
        jax.jit(lambda x: x + 1, out_shardings=one).lower(huge).compile()
    except Exception as err:  # JaxRuntimeError: RESOURCE_EXHAUSTED, the figure wanted
        found = _AVAILABLE.search(str(err))
        if found:
            return size_bytes(found.group(1), found.group(2))
    return None


def compiler_build(device: jax.Device) -> str | None:
    """The build of the libtpu that compiles for `device`, as its client names itself
    ("TFRT TPU7x, Built on Nov 5 2026 01:07:28 (1793869648) cl/1014260217")."""
    lines = getattr(device.client, "platform_version", "").splitlines()
    return ", ".join(line.strip() for line in lines[1:] if line.strip()) or None


def loaded_version() -> str | None:
    """The version of the libtpu this process compiles with: the pinned wheel's
    (`libtpu_version`), except where JAX already runs on TPU chips (a TPU host's `jax[tpu]`):
    one process loads one libtpu, so the runtime's compiles the plan and its version is
    named."""
    if jax.default_backend() == "tpu":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("libtpu")
        except PackageNotFoundError:
            return None
    return libtpu_version()


KIND_GENERATIONS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                    "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e", "TPU7x": "tpu7x"}
"""A TPU's `device_kind` -> the generation libtpu names its topologies by."""

TWO_D = ("v5e", "v6e")
"""Generations whose topologies are named in two dimensions (v5e:2x2); the others in three."""


def local_target(devices) -> str:
    """The topology of `devices` (a process's, or a compile-only target's) as libtpu names a
    compile-only target of it ('v5e:1x1' for one v5e chip, 'tpu7x:2x2x1' for a TPU7x host),
    read off their coordinates; for devices that are not TPUs, their kind ('cpu',
    'NVIDIA H200')."""
    device = devices[0]
    generation = KIND_GENERATIONS.get(device.device_kind)
    if device.platform != "tpu" or generation is None:
        return device.device_kind
    coords = [getattr(d, "coords", None) for d in devices]
    if any(c is None for c in coords):
        return f"{generation}:{len(coords)}"
    extent = [max(c[axis] for c in coords) - min(c[axis] for c in coords) + 1
              for axis in range(len(coords[0]))]
    dims = 2 if generation in TWO_D else 3
    extent = (extent + [1] * dims)[:dims]
    return f"{generation}:{'x'.join(map(str, extent))}"


def describe(name: str, slices: int = 1) -> dict:
    """The target as records and checks need it: kind and count of its devices, the version
    and build of the libtpu that compiles for it, the HBM one device may use."""
    devices = topology_devices(name, slices)
    return {"target": name, "slices": slices, "device_kind": devices[0].device_kind,
            "device_count": len(devices), "libtpu": loaded_version(),
            "libtpu_build": compiler_build(devices[0]),
            "hbm_capacity_bytes": available_hbm(devices[0])}


def probe(name: str, slices: int = 1, timeout_s: float = 120) -> dict:
    """`describe` of the target, from a short process of its own (this one stays free of
    libtpu); ValueError naming the fix when libtpu is missing, held, or does not know the
    topology. Nothing is compiled but the one-device capacity probe."""
    import subprocess

    from harness.system.reaper import die_with_parent

    check_topology(name, slices)
    check_libtpu()
    proc = subprocess.run([sys.executable, "-m", "harness.xla.target", name, str(slices)],
                          capture_output=True, text=True, timeout=timeout_s,
                          preexec_fn=die_with_parent(os.getpid()))
    lines = proc.stdout.strip().splitlines()
    try:
        described = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"the target probe printed no description (exit "
                           f"{proc.returncode}):\n{proc.stderr[-2000:]}") from None
    if "error" in described:
        raise ValueError(f"--target {name}" + (f" --target-slices {slices}" if slices > 1
                                               else "") +
                         f": libtpu cannot describe it ({described['error'][:300]}); give a "
                         f"topology libtpu knows, e.g. {TPU7X}, tpu7x:2x2x2, v5e:2x2, "
                         "v5p:2x2x1, v6e:2x2")
    return described


def main(argv: list[str]) -> int:
    name, slices = argv[0], int(argv[1]) if len(argv) > 1 else 1
    try:
        print(json.dumps(describe(name, slices)), flush=True)
    except Exception as err:  # libtpu's own words on a layout it does not know
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}), flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
