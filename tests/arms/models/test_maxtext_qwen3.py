"""MaxText's real Qwen3: conversion, what it cannot express, what its rules cannot shard."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from arms.models import maxtext_qwen3 as mq
from arms.spec import CellSpec
from engine.model import Decoder, get_preset, make_mesh

pytestmark = pytest.mark.maxtext  # every test here builds the real MaxText


@pytest.mark.parametrize(("ours_scanned", "theirs_scanned"),
                         [(False, False), (True, True), (False, True)])
def test_conversion_round_trips_bitwise_across_layouts(ours_scanned, theirs_scanned):
    source = get_preset("tiny-untied", scan_layers=ours_scanned, remat="full")
    decoder = Decoder(source, rngs=nnx.Rngs(2))
    # MaxText's layout of the other scan setting: layers on axis 1 when scanned.
    theirs = mq.decoder_to_maxtext_params(nnx.to_pure_dict(nnx.state(decoder, nnx.Param)),
                                          source)
    if theirs_scanned != ours_scanned:
        other = source.replace(scan_layers=theirs_scanned)
        theirs = mq.decoder_to_maxtext_params(mq.maxtext_to_decoder_params(theirs, other), other)
    if theirs_scanned:
        assert theirs["decoder"]["layers"]["self_attention"]["query"]["kernel"].shape == (
            64, 2, 4, 16)  # (embed, layers, heads, head_dim)
    back = mq.maxtext_to_decoder_params(theirs, source)
    for a, b in zip(jax.tree.leaves(back),
                    jax.tree.leaves(nnx.to_pure_dict(nnx.state(decoder, nnx.Param))),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_real_model_round_trips_through_from_maxtext():
    config = get_preset("tiny-untied", remat="full")
    decoder = Decoder(config, rngs=nnx.Rngs(3))
    back = mq.from_maxtext(mq.to_maxtext(decoder), config)
    for a, b in zip(jax.tree.leaves(nnx.state(back, nnx.Param)),
                    jax.tree.leaves(nnx.state(decoder, nnx.Param)), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_config_carries_every_dimension_and_the_qwen3_knobs(monkeypatch):
    config = get_preset("small", remat="full")
    monkeypatch.delenv("XLA_FLAGS")  # MaxText sets its HLO-dump flags when this is empty
    mx = mq.maxtext_config(config, mesh_shape={"fsdp": 2}, seq=64)
    assert "XLA_FLAGS" not in os.environ  # the environment records compare by is untouched
    assert (mx.emb_dim, mx.num_query_heads, mx.num_kv_heads, mx.head_dim, mx.mlp_dim,
            mx.num_decoder_layers, mx.vocab_size, mx.max_target_length) == (
        256, 8, 4, 32, 768, 4, 4096, 64)
    assert mx.use_qk_norm and mx.rope_max_timescale == 1_000_000
    assert mx.normalization_layer_epsilon == 1e-6 and mx.logits_via_embedding
    assert mx.ici_fsdp_parallelism == 2 and mx.jax_cache_dir == ""
    assert mx.remat_policy == "full"


@pytest.mark.parametrize("scan", [False, True])
def test_no_remat_is_refused_before_anything_is_built(scan):
    """MaxText's decoder rematerializes every layer, scanned or not ('none' is full remat
    there): a MaxText arm without remat would do other work than the arms on our decoder."""
    from arms.registry import make_arm

    for arm in ("peft-maxtext", "maxtext-engine"):
        with pytest.raises(ValueError, match=r"remat=none cannot be expressed; use --remat "
                                             r"full \(the same work as MaxText's 'none'\)"):
            make_arm(arm, CellSpec(preset="tiny", scan_layers=scan))
    make_arm("peft-decoder", CellSpec(preset="tiny", scan_layers=scan))  # only MaxText's limit
    make_arm("peft-maxtext", CellSpec(preset="tiny", scan_layers=scan, remat="full"))


def test_a_mesh_maxtext_rules_cannot_shard_names_the_parameter(devices):
    config = get_preset("tiny", remat="full")
    mx = mq.maxtext_config(config)
    _, _, creation = mq.require_maxtext()
    one = mq.maxtext_mesh(make_mesh(""), mx)
    abstract = nnx.eval_shape(lambda: creation.from_config(mx, mesh=one,
                                                           rngs=nnx.Rngs(params=0, dropout=1)))
    mq.check_shardable(abstract, mq.maxtext_mesh(make_mesh("fsdp=8"), mx), mx)  # divides
    with pytest.raises(ValueError, match=r"split decoder/layers_0/self_attention/key/kernel "
                                         r"\(shape \(64, 2, 16\)\) over mesh axes tensor\S* = 8 "
                                         r"ways, which does not divide 2"):
        mq.check_shardable(abstract, mq.maxtext_mesh(make_mesh("tensor=8"), mx), mx)


def test_missing_maxtext_is_one_import_error_naming_the_fix(monkeypatch):
    monkeypatch.setitem(sys.modules, "maxtext", None)
    monkeypatch.delitem(sys.modules, "maxtext.configs", raising=False)
    monkeypatch.delitem(sys.modules, "maxtext.configs.pyconfig", raising=False)
    with pytest.raises(ImportError, match=r"the maxtext arms need the `maxtext` package"):
        mq.to_maxtext(Decoder(get_preset("tiny", remat="full"), rngs=nnx.Rngs(0)))


def _python(code: str, tmp) -> str:
    """Runs `code` in a fresh interpreter whose temp dir is `tmp`; its stdout."""
    env = {**os.environ, "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-c", code], env=env, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_run_roots_of_exited_processes_are_removed_even_without_exit_handlers(tmp_path):
    # A zygote-forked cell worker leaves by os._exit: its directory outlives it ...
    make = "from arms.models.maxtext_qwen3 import run_root; print(run_root())"
    left = _python(f"{make}; import os, sys; sys.stdout.flush(); os._exit(0)", tmp_path)
    assert os.path.isdir(left)
    assert os.path.dirname(left) == str(tmp_path / f"parity-maxtext-{os.getuid()}")
    live = os.path.join(os.path.dirname(left), str(os.getpid()))  # a running process's
    os.makedirs(live)
    # ... until the next process makes its own; a normal exit removes its own at once.
    made = _python(make, tmp_path)
    assert made != left
    assert not os.path.exists(left)
    assert not os.path.exists(made)
    assert os.path.isdir(live)


def test_a_forked_worker_makes_its_own_run_root(tmp_path):
    # The zygote may have made one before forking the cell's worker: the worker's differs.
    code = ("import os\n"
            "from arms.models.maxtext_qwen3 import run_root\n"
            "print(run_root(), flush=True)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    print(run_root(), flush=True)\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    parent, child = _python(code, tmp_path).splitlines()
    assert parent != child
    assert os.path.dirname(parent) == os.path.dirname(child)
    assert os.path.basename(child).isdigit()
