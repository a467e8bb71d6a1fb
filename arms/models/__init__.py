"""Model adapters for arms (models other than our own decoder)."""

from __future__ import annotations

from collections.abc import Callable

import jax
from flax import nnx

from engine.model import DecoderConfig, run_once_options


def check_own_computation(config: DecoderConfig, model: str) -> None:
    """Raises one ValueError where `config` asks our decoder's own way of computing (a Pallas
    attention kernel, chunked logits) of `model`, a model that computes its attention and its
    logits its own way. `attention="auto"` is accepted: it names our decoder's choice, and
    other models run their own attention."""
    if config.attention == "splash":
        raise ValueError(f"--attention splash is our decoder's Pallas kernel; {model}'s model "
                         "runs its own attention: use --attention xla or auto for its arms")
    if config.logits_chunk:
        raise ValueError(f"--logits-chunk {config.logits_chunk} chunks our decoder's head; "
                         f"{model}'s model computes its whole logits: use --logits-chunk 0 "
                         "for its arms")
    if config.scan_backward != "jax":
        raise ValueError(f"--scan-backward {config.scan_backward} is how our decoder's layer "
                         f"scan is differentiated; {model}'s model runs its own: use "
                         "--scan-backward jax for its arms")


def compiled_module(make: Callable[[], nnx.Module], abstract: nnx.Module | None = None
                    ) -> nnx.Module:
    """`make()`, its variables computed by one compiled program instead of eagerly.

    Eagerly, every parameter's random draw is a dispatch and a compile of its own (Tunix's
    Qwen3 at `tiny`: ~45 compiles; 3-5 s of a 2-core cell's start). The module's structure
    comes from `nnx.eval_shape`, its values from `jax.jit` of the same construction,
    compiled on CPU without LLVM optimization as `engine.model.build_decoder` is (it runs
    once). Meant for models whose weights are overwritten right after (converted from our
    decoder): only their other state (RNG keys and counts) keeps these values, and integer
    RNG arithmetic gives the same bits compiled or eager. `abstract`: `nnx.eval_shape(make)`
    where the caller has it already.
    """
    graph = nnx.split(abstract if abstract is not None else nnx.eval_shape(make))[0]
    init = jax.jit(lambda: nnx.split(make())[1]).lower().compile(
        compiler_options=run_once_options())
    return nnx.merge(graph, init())
