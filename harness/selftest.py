"""`parity selftest`: a few-second check that model, workload and Tunix parity are sound."""

from __future__ import annotations

import time
from collections.abc import Sequence

from flax import nnx

from arms.workload import (
    TokenCrossEntropy,
    denominators,
    exact_loss_and_gradient,
    fingerprint,
    forward,
    global_norm,
    make_micro_batches,
    max_rel_error,
)
from engine.model import Decoder, get_preset, param_count

PARITY_TOLERANCE = 1e-5
"""Max relative logits error allowed between our decoder and Tunix's Qwen3 (float32)."""


def selftest(preset: str = "tiny", ragged: Sequence[int] = (64, 16, 40, 8)) -> list[str]:
    """Runs the checks and returns report lines; raises AssertionError if parity fails."""
    from arms.models.tunix_qwen3 import to_tunix  # tunix import is slow; only here

    start = time.perf_counter()
    config = get_preset(preset)
    lines = [f"preset {preset}: {param_count(config):,} parameters"]
    for name in ("qwen3-0.6b", "qwen3-8b"):
        lines.append(f"preset {name}: {param_count(get_preset(name)):,} parameters (abstract)")

    model = Decoder(config, rngs=nnx.Rngs(0))
    batches = make_micro_batches(seed=0, batch_size=4, seq_len=32,
                                 vocab_size=config.vocab_size, loss_tokens=ragged)
    loss, grads = exact_loss_and_gradient(model, batches, TokenCrossEntropy())
    dens = ", ".join(f"{d:g}" for d in denominators(batches))
    lines.append(f"ragged micro-batches [{dens}] fingerprint {fingerprint(batches)[:12]}: "
                 f"loss {loss:.6f}, exact gradient L2 {global_norm(grads):.6f}")

    for tie in (True, False):
        for scan in (False, True):
            tiny = get_preset("tiny", tie_embeddings=tie, scan_layers=scan)
            ours = Decoder(tiny, rngs=nnx.Rngs(1))
            err = max_rel_error(forward(to_tunix(ours), batches[0]), forward(ours, batches[0]))
            verdict = "ok" if err <= PARITY_TOLERANCE else "FAIL"
            lines.append(f"tiny tied={tie!s:5} scan={scan!s:5} decoder vs Tunix Qwen3 logits: "
                         f"max rel err {err:.2e} (<= {PARITY_TOLERANCE:g}) {verdict}")
            if err > PARITY_TOLERANCE:
                raise AssertionError("\n".join(lines))
    lines.append(f"selftest passed in {time.perf_counter() - start:.1f} s")
    return lines
