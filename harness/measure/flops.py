"""Model FLOPs of a training step: the analytic count, MaxText's convention.

A matmul of an (M, K) by a (K, N) matrix does M*N*K multiply-adds, 2*M*N*K
FLOPs. A token passing through a weight matrix of shape (K, N) therefore costs 2*K*N FLOPs
forward. Backward needs two matmuls of the same size per weight (the gradient with respect to
the input, dL/dx = dL/dy W^T, and with respect to the weight, dL/dW = x^T dL/dy), so a training
step costs 3x the forward matmuls: fwd + 2x fwd. Attention adds matmuls that have no weight:
scores Q K^T and context P V, 2*S*H FLOPs each per query token and head, 4*B*S^2*N*H for the
whole batch; with a causal mask a query sees on average half the keys, so the useful work is
half of that (Megatron/NeMo/MaxText all divide by 2, whatever the kernel really computes).
The embedding lookup is a gather (no arithmetic) and is not counted; the output head (the
unembedding, tied or not) is a D x V matmul and is. Norms, RoPE, softmax and the SwiGLU gate
product are elementwise, a vanishing share, and are left out, as is remat's recomputation:
this is the "model FLOPs" of MFU, the work the model needs, not the work an engine happens to
do, so it is the same with or without scan, remat, gradient accumulation or sharding. What
a compiled program does is counted from its HLO (harness.xla).
"""

from __future__ import annotations

import dataclasses

from engine.model import DecoderConfig

SWIGLU_IN_PROJECTIONS = 2
"""SwiGLU's MLP has two input projections (gate wi_0, up wi_1) and one output (wo)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelFlops:
    """Analytic training FLOPs of one optimizer step, fwd + bwd, summed over all devices."""

    weights: float
    """Matmuls with a learnable weight (qkv, attention out, MLP, output head), x3."""
    attention: float
    """Causal attention's weight-less matmuls (scores and context, halved for the mask), x3."""

    @property
    def total(self) -> float:
        """weights + attention: the numerator of MFU."""
        return self.weights + self.attention


def model_flops(config: DecoderConfig, *, batch: int, seq: int) -> ModelFlops:
    """MaxText's `calculate_tflops_training_per_device` (dense branch) for `batch` rows of
    `seq` tokens, in FLOPs and over the whole step (MaxText's numbers are per device for
    per_device_batch_size rows: ours = theirs * 1e12 * number of devices)."""
    if batch <= 0 or seq <= 0:
        raise ValueError(f"batch and seq must be positive, got batch={batch}, seq={seq}")
    tokens = batch * seq
    D, N, K, H = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
    mlp = 2 * tokens * config.mlp_dim * D * (SWIGLU_IN_PROJECTIONS + 1)
    qkv = 2 * tokens * D * (N + 2 * K) * H
    out_projection = 2 * tokens * D * N * H
    causal_attention = 4 * batch * seq**2 * N * H / 2
    unembedding = 2 * tokens * D * config.vocab_size
    per_layer = mlp + qkv + out_projection
    return ModelFlops(weights=3.0 * (per_layer * config.num_layers + unembedding),
                      attention=3.0 * causal_attention * config.num_layers)


def model_flops_per_step(config: DecoderConfig, *, batch: int, seq: int) -> float:
    """Total training FLOPs of one optimizer step over batch*seq tokens (see `model_flops`)."""
    return model_flops(config, batch=batch, seq=seq).total


def compiled_matmul_flops(config: DecoderConfig, *, batch: int, seq: int,
                          remat: str) -> float | None:
    """The matmul FLOPs a compiled training step of `batch` rows of `seq` tokens does (all
    devices), by the same formula as `model_flops` but counting what the program computes:

    - attention's matmuls whole: a dense kernel computes every (query, key) score and masks
      it afterwards, so the causal mask saves nothing (twice the model's attention);
    - with `remat="full"` each layer's forward once more in the backward pass, less its last
      matmul: the backward reads every matmul's input and the softmax, never the layer's
      output, so the recomputed MLP down projection feeds nothing and XLA drops it as dead
      code; the output head is outside the rematerialized layers and is not recomputed;
    - with `remat="none"` nothing more: fwd + 2x fwd, as for model FLOPs.

    None for a remat policy whose saved values this formula does not know ("minimal")."""
    if remat not in ("none", "full"):
        return None
    tokens = batch * seq
    D, N, K, H = config.embed_dim, config.num_heads, config.num_kv_heads, config.head_dim
    down_projection = 2 * tokens * config.mlp_dim * D
    layer = (down_projection * (SWIGLU_IN_PROJECTIONS + 1) + 2 * tokens * D * (N + 2 * K) * H
             + 2 * tokens * D * N * H + 4 * batch * seq**2 * N * H)
    unembedding = 2 * tokens * D * config.vocab_size
    recomputed = layer - down_projection if remat == "full" else 0
    return config.num_layers * (3.0 * layer + recomputed) + 3.0 * unembedding
