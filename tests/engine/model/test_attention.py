"""The Pallas attention kernels against the XLA attention, and the rule that picks one.

On CPU the kernels run in Pallas interpret mode: the kernel's own blocked arithmetic (online
softmax over kv blocks, its backward's dq and dkv kernels), evaluated as XLA ops. Tolerances:

- float32: both paths compute the same sums in another order (per kv block and rescaled, or
  whole rows). Rounding errors of float32 (unit roundoff u = 2^-24 ~ 6e-8 per operation,
  eps = 2^-23 ~ 1.2e-7) grow like a random walk over the H-term dot products and the S-term
  softmax and value sums: a relative l2 error of order sqrt(H + S) * eps (~2.3e-6 at H 128,
  S 256). F32_TOL allows 4x that for the exponentials, logarithms and per-block rescaling
  (measured: 5-6e-7).
- bfloat16: the paths round different intermediates to bfloat16 (unit roundoff 2^-8): the
  scaled queries (before the product here, the scores after it in XLA), the probabilities
  (normalized here, unnormalized in XLA) and the output; BF16_TOL allows four such roundings
  (measured: 4-6e-3).
"""

import json
import math
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from arms.workload import make_micro_batches, rel_l2, target_logprobs
from engine.model import (
    Decoder,
    build_decoder,
    check_sequence,
    get_preset,
    make_mesh,
    sharding_context,
)
from engine.model.attention import (
    AUTO_KERNEL,
    AUTO_KERNEL_MIN_SEQ,
    attend,
    flash,
    resolve,
    splash,
)
from engine.model.decoder import attention_mask

B, L, K, G, H = 2, 256, 2, 2, 128
F32_TOL = 4 * math.sqrt(H + L) * 2.0**-23
BF16_TOL = 4 * 2.0**-8
BLOCKS = {"block_q": 128, "block_kv": 128}


def _inputs(dtype):
    """q, k, v of one layer and [B, L] segment ids packing 2 and 3 documents per row."""
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((B, L, K, G, H)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((B, L, K, H)), dtype) for _ in range(2))
    segments = np.ones((B, L), np.int32)
    segments[0, 100:] = 2
    segments[1, 37:], segments[1, 200:] = 2, 3
    weights = jnp.asarray(rng.standard_normal((B, L, K, G, H)), jnp.float32)
    return q, k, v, jnp.asarray(segments), weights


def _value_and_grads(attention, q, k, v, weights):
    """sum(o * weights) and its gradient w.r.t. q, k and v, as float32."""
    def objective(q, k, v):
        return jnp.sum(attention(q, k, v).astype(jnp.float32) * weights)
    out = attention(q, k, v).astype(jnp.float32)
    grads = jax.jit(jax.grad(objective, argnums=(0, 1, 2)))(q, k, v)
    return out, [g.astype(jnp.float32) for g in grads]


def _assert_close(found, expected, tol):
    (out, grads), (ref_out, ref_grads) = found, expected
    assert rel_l2(out, ref_out) <= tol
    for name, g, ref in zip("qkv", grads, ref_grads, strict=True):
        assert rel_l2(g, ref) <= tol, name


@pytest.mark.parametrize(("dtype", "tol"), [(jnp.float32, F32_TOL), (jnp.bfloat16, BF16_TOL)])
def test_splash_in_interpret_mode_is_the_xla_attention_forward_and_backward(dtype, tol):
    q, k, v, segments, weights = _inputs(dtype)
    mask = attention_mask(segments)
    expected = _value_and_grads(lambda q, k, v: attend(q, k, v, mask), q, k, v, weights)
    found = _value_and_grads(
        lambda q, k, v: splash(q, k, v, segments, interpret=True, **BLOCKS), q, k, v, weights)
    _assert_close(found, expected, tol)


def test_splash_respects_the_packed_segments():
    """Without the segment ids the kernel would be plain causal attention: far off."""
    q, k, v, segments, _ = _inputs(jnp.float32)
    one_document = jnp.ones_like(segments)
    packed = splash(q, k, v, segments, interpret=True, **BLOCKS)
    assert rel_l2(splash(q, k, v, one_document, interpret=True, **BLOCKS), packed) > 0.1
    assert rel_l2(attend(q, k, v, attention_mask(one_document)),
                  splash(q, k, v, one_document, interpret=True, **BLOCKS)) <= F32_TOL


def test_flash_under_tpu_interpret_mode_is_the_xla_attention_forward_and_backward():
    q, k, v, segments, weights = _inputs(jnp.float32)
    mask = attention_mask(segments)
    expected = _value_and_grads(lambda q, k, v: attend(q, k, v, mask), q, k, v, weights)
    with pltpu.force_tpu_interpret_mode():  # flash has no interpret switch of its own
        found = _value_and_grads(lambda q, k, v: flash(q, k, v, segments, **BLOCKS),
                                 q, k, v, weights)
    _assert_close(found, expected, F32_TOL)


def test_auto_picks_the_kernel_only_on_a_tpu_from_the_threshold():
    """The threshold is the shortest length the chip measured the kernel winning at (2048:
    docs/results/tpu-v5e/h2h73/kernels-s2048.md); at 1024 it did not."""
    blocks = {"block_q": 512, "block_kv": 1024}
    assert AUTO_KERNEL_MIN_SEQ == 2048 and AUTO_KERNEL == "splash"
    assert resolve("auto", seq=2048, platform="tpu", **blocks) == "splash"
    assert resolve("auto", seq=3072, platform="tpu", **blocks) == "splash"
    assert resolve("auto", seq=8192, platform="tpu", **blocks) == "splash"
    assert resolve("auto", seq=1024, platform="tpu", **blocks) == "xla"  # no kernel won there
    assert resolve("auto", seq=4096 + 512, platform="tpu", **blocks) == "xla"  # blocks don't tile
    for platform in ("cpu", "gpu"):
        assert resolve("auto", seq=8192, platform=platform, **blocks) == "xla"
    for kind in ("xla", "splash"):  # an explicit choice is itself, anywhere
        assert resolve(kind, seq=128, platform="cpu", **blocks) == kind


def _has_kernel(config, seq, mesh=None) -> bool:
    """Whether the decoder's traced program (loss statistics, forward and backward) calls a
    Pallas kernel, at `seq` under `mesh` (default: none, JAX's CPU backend)."""
    model = nnx.eval_shape(lambda: Decoder(config.replace(scan_layers=True), rngs=nnx.Rngs(0)))
    graph, state = nnx.split(model)
    batch = make_micro_batches(seed=0, batch_size=2, seq_len=seq, vocab_size=256)[0]

    def loss(state):
        return jnp.sum(target_logprobs(nnx.merge(graph, state), batch)[0])

    if mesh is None:
        return "pallas_call" in str(jax.make_jaxpr(jax.grad(loss))(state))
    with sharding_context(mesh):
        return "pallas_call" in str(jax.make_jaxpr(jax.grad(loss))(state))


def test_the_decoder_runs_the_kernel_it_is_configured_with(devices):
    tiny = get_preset("tiny", attention_block_q=128, attention_block_kv=128)
    assert _has_kernel(tiny.replace(attention="splash"), 256)
    assert _has_kernel(tiny.replace(attention="splash"), 256, make_mesh("fsdp=2,tensor=2"))
    assert not _has_kernel(tiny, 256)
    # auto on CPU: the XLA path at any length, the default blocks included
    assert not _has_kernel(get_preset("tiny", attention="auto"), AUTO_KERNEL_MIN_SEQ)


def _loss_and_grad(config, batch, mesh=None):
    model = build_decoder(config, seed=0, mesh=mesh)
    graph, state = nnx.split(model)

    def loss(state):
        logprob, logz = target_logprobs(nnx.merge(graph, state), batch)
        return -jnp.sum(logprob) + 1e-3 * jnp.sum(jnp.square(logz))

    if mesh is None:
        return jax.jit(jax.value_and_grad(loss))(state)
    with sharding_context(mesh):
        return jax.jit(jax.value_and_grad(loss))(state)


@pytest.mark.parametrize("mesh", [None, "fsdp=2,tensor=2"])
def test_the_decoder_with_splash_computes_the_xla_decoders_loss_and_gradient(devices, mesh):
    """Two layers of tiny (head dim 16, 4 query heads over 2 kv heads) at seq 256, float32;
    on a mesh each device runs the kernel on its own rows and heads (shard_map). The layers
    compound the kernel's reordering: the whole gradient is held to 4x F32_TOL."""
    tiny = get_preset("tiny")
    batch = make_micro_batches(seed=1, batch_size=4, seq_len=L, vocab_size=256)[0]
    mesh = make_mesh(mesh) if mesh else None
    loss, grad = _loss_and_grad(tiny, batch, mesh)
    kernel_loss, kernel_grad = _loss_and_grad(
        tiny.replace(attention="splash", attention_block_q=128, attention_block_kv=128), batch,
        mesh)
    assert abs(float(kernel_loss) - float(loss)) <= F32_TOL * abs(float(loss))
    assert rel_l2(nnx.to_pure_dict(kernel_grad), nnx.to_pure_dict(grad)) <= 4 * F32_TOL


@pytest.mark.parametrize(("overrides", "message"), [
    ({"attention_block_q": 96}, r"attention_block_q=96: the splash attention kernel's blocks "
                                r"are multiples of 128"),
    ({"attention_block_kv": 1024}, r"attention_block_kv=1024 does not divide seq 640; pass "
                                   r"--attention-block-kv with a multiple of 128 that divides "
                                   r"640 \(e.g. 640\)"),
])
def test_blocks_that_cannot_tile_the_sequence_are_refused_naming_the_fix(overrides, message):
    config = get_preset("tiny", attention="splash", **{"attention_block_q": 128, **overrides})
    with pytest.raises(ValueError, match=message):
        check_sequence(config, 640)
    check_sequence(config.replace(attention="auto"), 640)  # auto falls back to xla there


@pytest.mark.slow  # Mosaic compiles the kernel for v5e at 4096 positions (~40 s);
# test_auto_picks_the_kernel_only_on_a_tpu_from_the_threshold checks the rule
def test_on_a_tpu_auto_runs_splash_from_4096_and_the_kernel_compiles_for_the_v5e():
    """Compiled for one TPU v5e chip by libtpu (compile-only devices; in a process of its own,
    `tests/engine/model/tpu_attention.py`): traced under a mesh of that TPU, tiny's gradient
    with attention="auto" calls the splash kernels at seq 4096 (forward, its recompute under
    full remat, dq, dkv: 4 calls) and none at seq 1024; over 4 chips (fsdp=4) it compiles,
    each device running the kernel on its rows; Mosaic compiles the kernel at the default
    blocks for one qwen3-0.6b layer at seq 4096, where XLA:TPU plans 1.09 GB of temporaries
    for the XLA attention's float32 scores and the kernel about 1 MiB."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-m", "tests.engine.model.tpu_attention"],
                         capture_output=True, text=True, env=env, timeout=600,
                         cwd=pathlib.Path(__file__).parents[3])
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.splitlines()[-1])
    assert found["device_kind"] == "TPU v5 lite"
    assert found["decoder"] == {"auto@4096": 4, "auto@1024": 0, "splash@1024": 4}
    assert found["fsdp=4"] == 4
    xla, kernel = found["layer"]["xla@1x4096"], found["layer"]["splash@1x4096"]
    assert xla["kernels"] == 0 and kernel["kernels"] == 3  # forward, dq, dkv
    scores = 16 * 4096 * 4096 * 4  # one float32 [N, L, S] of the layer
    assert xla["temp_bytes"] >= scores > 100 * kernel["temp_bytes"]
